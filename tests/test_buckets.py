"""Storage Buckets as a remote (hf://buckets/...): no commits and no compare-and-swap, so refs
move through a log of confirmed entries (remotes/bucket.py). The conformance suite runs on a
bucket too (the "bucket" remote_url); here: per-step publishing, racing pushers, killed pushes."""

import multiprocessing
import os
import signal
import subprocess
import sys

import pytest
import torch
from safetensors.torch import save_file

import wvc
from wvc import Repo, clone

from .conftest import REPO_ROOT, tree_digests

pytestmark = pytest.mark.usefixtures("hub_env")


def _bits(sd: dict) -> dict:
    return {k: v.view(torch.int16) if v.dtype == torch.bfloat16 else v for k, v in sd.items()}


def test_a_publisher_pushes_every_step_to_a_bucket_and_a_follower_gets_each_exactly(tmp_path, monkeypatch):
    """100 steps, each published and pushed (flush: the trainer waits for the push, as a run
    slower than its pushes does), each reaching a follower in another thread bit-exact."""
    from wvc.integrations.publisher import Publisher
    from wvc.remotes import open_backend

    monkeypatch.setenv("WVC_CACHE", str(tmp_path / "cache"))
    url = f"hf://buckets/team/steps-{tmp_path.name}/run"
    pub = Publisher(tmp_path / "trainer", "main", push_to=url, max_pending=100)
    assert pub.push_interval == 0.0  # a bucket has no commit quota: nothing holds a push back
    g = torch.Generator().manual_seed(0)
    sd = {f"w{i}": (torch.randn(128, 256, generator=g) * 0.02).to(torch.bfloat16) for i in range(3)}
    follower, got = None, []
    for step in range(100):
        sd["w1"].view(torch.int16).reshape(-1)[step::37] += 1
        pub.publish(sd, message=f"step {step}", metadata={"step": step})
        assert pub.flush(timeout=60), pub.errors
        follower = follower or wvc.follow(url)
        update = follower.update(timeout=30)
        assert update is not None, f"step {step} did not reach the follower"
        got.append(update.commit)
        assert all(torch.equal(a, b) for a, b in zip(_bits(follower.state_dict).values(), _bits(sd).values()))
    assert pub.close(timeout=60) and not pub.errors and not pub.unpushed
    with Repo.open(tmp_path / "trainer") as repo:
        log = list(reversed(repo.log("main")))
    assert [e.metadata["step"] for e in log] == list(range(100)) and got == [e.id for e in log]
    remote = open_backend(url)
    remote.listing()
    assert int(remote.head[:12]) == 99  # one ref update a step: 100 pushes


def _race_worker(barrier, tasks, results):
    """Pushes each repository it is given the moment the other worker does too."""
    from wvc import Repo as R
    from wvc.errors import WvcError

    while (path := tasks.get()) is not None:
        repo = R.open(path)
        barrier.wait()
        try:
            repo.push()
            results.put((path, "won", ""))
        except WvcError as exc:
            results.put((path, type(exc).__name__, str(exc)))
        finally:
            repo.close()


def test_two_pushers_racing_on_one_bucket_ref_exactly_one_wins(tmp_path, hub):
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    queues = [ctx.Queue(), ctx.Queue()]
    workers = [ctx.Process(target=_race_worker, args=(barrier, q, results)) for q in queues]
    for w in workers:
        w.start()
    retractions = []
    try:
        for trial in range(20):
            url = f"hf://buckets/team/race-{tmp_path.name}/t{trial}"
            a = Repo.init(tmp_path / f"a{trial}")
            save_file({"w": torch.zeros(64, 64)}, str(a.root / "model.safetensors"))
            a.commit("base")
            a.remote_add("origin", url)
            a.push()
            b = clone(url, tmp_path / f"b{trial}")
            mine = {}
            for who, repo in (("a", a), ("b", b)):
                save_file({"w": torch.full((64, 64), float(trial))}, str(repo.root / f"{who}.safetensors"))
                mine[str(repo.root)] = repo.commit(f"{who} {trial}").commit
                repo.close()
            queues[0].put(str(a.root))
            queues[1].put(str(b.root))
            ops_before = len(hub.bucket_ops)
            outcome = dict((path, (kind, msg)) for path, kind, msg in (results.get(timeout=180) for _ in range(2)))
            kinds = sorted(kind for kind, _ in outcome.values())
            assert kinds == ["NonFastForward", "won"], (trial, outcome)
            # the protocol ran: the loser's proposal was withdrawn (two pushes one after the
            # other fail the ordinary fast-forward check with the same error, proposing nothing)
            retracted = [p for kind, p in hub.bucket_ops[ops_before:]
                         if kind == "deleteFile" and f"/t{trial}/reflog/" in p and p.endswith(".json")]
            retractions.append(len(retracted))
            winner = next(p for p, (kind, _) in outcome.items() if kind == "won")
            loser = next(p for p, (kind, _) in outcome.items() if kind != "won")
            from wvc.remotes import open_backend

            assert open_backend(url).listing().refs["refs/heads/main"] == mine[winner]
            for path, commit in mine.items():  # both commits are still there locally
                with Repo.open(path) as repo:
                    assert repo.head() == commit
            with Repo.open(loser) as repo:  # and the loser can pull and push on top
                repo.pull(rebase=True)
                repo.push()
        assert sum(1 for n in retractions if n) >= 15, retractions  # they raced (nearly) every time
    finally:
        for q in queues:
            q.put(None)
        for w in workers:
            w.join(timeout=60)


def test_a_push_killed_at_any_request_leaves_the_bucket_readable_and_the_next_push_completes(tmp_path, hub, monkeypatch):
    monkeypatch.setenv("WVC_BUCKET_STALE_SECONDS", "1")  # a killed pusher's proposal is passed over after 1 s
    url = f"hf://buckets/team/killed-{tmp_path.name}/m"
    repo = Repo.init(tmp_path / "m")
    save_file({"w": torch.zeros(256, 256)}, str(repo.root / "model.safetensors"))
    repo.commit("base")
    repo.remote_add("origin", url)
    repo.push()
    head = repo.head()
    # how many requests one push makes
    save_file({"w": torch.ones(256, 256)}, str(repo.root / "model.safetensors"))
    repo.commit("probe")
    before = len(hub.requests)
    repo.push()
    per_push = len(hub.requests) - before
    head = repo.head()
    repo.close()
    push = [sys.executable, "-m", "wvc", "push"]
    for k in range(1, per_push + 1):
        with Repo.open(tmp_path / "m") as r:
            save_file({"w": torch.full((256, 256), float(k + 2))}, str(r.root / "model.safetensors"))
            new = r.commit(f"step {k}").commit
        proc = subprocess.Popen(push, cwd=tmp_path / "m", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
        seen = []

        def kill_at_k(method, path, proc=proc, seen=seen, k=k):
            seen.append(path)
            if len(seen) == k:
                os.kill(proc.pid, signal.SIGKILL)

        hub.on_request = kill_at_k
        try:
            proc.wait(timeout=120)
        finally:
            hub.on_request = None
        assert proc.returncode == -signal.SIGKILL, (k, proc.returncode)  # killed mid-push, not finished
        state = clone(url, tmp_path / f"reader{k}")  # readable: the old head, or the new one if it was confirmed
        assert state.head() in (head, new) and state.fsck().ok
        with Repo.open(tmp_path / "m") as r:
            r.push()  # completes (a leftover proposal is stale after WVC_BUCKET_STALE_SECONDS)
        again = clone(url, tmp_path / f"after{k}")
        assert again.head() == new and tree_digests(again.root) == tree_digests(tmp_path / "m")
        head = new


def _counting_confirmations(url: str) -> dict[int, list[str]]:
    """seq -> the entries whose confirmation counts, as every reader computes them."""
    from wvc.remotes import open_backend
    from wvc.remotes.bucket import _seq
    from wvc.remotes.layout import REFLOG

    remote = open_backend(url)
    _, confirmed = remote._log(remote._list(REFLOG))
    out: dict[int, list[str]] = {}
    for name in confirmed:
        out.setdefault(_seq(name), []).append(name)
    return out


def _push_worker(barrier, tasks, results):
    """Pushes each (repository, branch) it is given once every worker holds one."""
    from wvc import Repo as R
    from wvc.errors import WvcError

    while (task := tasks.get()) is not None:
        path, branch = task
        repo = R.open(path)
        barrier.wait()
        try:
            repo.push("origin", branch)
            results.put((path, branch, "won", ""))
        except WvcError as exc:
            results.put((path, branch, type(exc).__name__, str(exc)))
        finally:
            repo.close()


def _pushers(n):
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(n), ctx.Queue()
    queues = [ctx.Queue() for _ in range(n)]
    workers = [ctx.Process(target=_push_worker, args=(barrier, q, results)) for q in queues]
    for w in workers:
        w.start()
    workers.append(barrier)  # (held while they run: a collected barrier's semaphore is gone before a child unpickles it)
    return queues, results, workers


def _stop(queues, workers):
    for q in queues:
        q.put(None)
    for w in workers[:-1]:
        w.join(timeout=60)


def _repos_on(url, tmp_path, n, tag, *, branches):
    """A bucket holding one base version, and ``n`` clones each with a new commit on its branch."""
    a = Repo.init(tmp_path / f"{tag}-origin")
    save_file({"w": torch.zeros(64, 64)}, str(a.root / "model.safetensors"))
    a.commit("base")
    a.remote_add("origin", url)
    a.push()
    a.close()
    out = []
    for k in range(n):
        r = clone(url, tmp_path / f"{tag}-{k}")
        save_file({"w": torch.full((64, 64), float(k + 1))}, str(r.root / f"p{k}.safetensors"))
        out.append((str(r.root), branches[k], r.commit(f"pusher {k}", branch=branches[k]).commit))
        r.close()
    return out


def test_a_rate_limited_confirm_is_not_resent_after_its_lease_and_one_push_wins(tmp_path, hub, monkeypatch):
    """Issue 49, item 2: the first confirm answered 429 with a Retry-After longer than the
    lease. It used to be resent after the wait, when the rival had passed over its proposal
    and confirmed its own entry at the same seq: both pushes reported success."""
    monkeypatch.setenv("WVC_BUCKET_STALE_SECONDS", "3")
    url = f"hf://buckets/team/limited-{tmp_path.name}/m"
    pushers = _repos_on(url, tmp_path, 2, "p", branches=["main", "main"])
    queues, results, workers = _pushers(2)
    try:
        hub.bucket_faults.append({"op": "copyFile", "status": 429, "retry_after": 4})  # past the lease
        for q, (path, branch, _) in zip(queues, pushers):
            q.put((path, branch))
        outcome = {path: kind for path, _, kind, _ in (results.get(timeout=180) for _ in range(2))}
    finally:
        _stop(queues, workers)
    assert not hub.bucket_faults  # a confirm was refused
    assert sorted(outcome.values()) == ["NonFastForward", "won"], outcome
    winner = next(commit for path, _, commit in pushers if outcome[path] == "won")
    assert clone(url, tmp_path / "reader").head() == winner
    assert all(len(v) == 1 for v in _counting_confirmations(url).values())


@pytest.mark.slow
def test_pushers_under_throttled_and_late_confirms_land_or_fail_never_both(tmp_path, hub, monkeypatch):
    """Two and three pushers at once (each its own branch, so that several may land), their
    confirms refused with 429s or applied late (past the lease) in random order: every push
    either lands (its commit is its branch on the bucket) or reports failure, and no seq ever
    holds two confirmations that count."""
    import random

    monkeypatch.setenv("WVC_BUCKET_STALE_SECONDS", "4")  # (room for a loaded machine: confirms count within 2 s)
    rng = random.Random(49)
    for n in (2, 3):
        queues, results, workers = _pushers(n)
        try:
            for trial in range(3):
                url = f"hf://buckets/team/throttled-{tmp_path.name}/n{n}-t{trial}"
                pushers = _repos_on(url, tmp_path, n, f"n{n}-t{trial}", branches=[f"b{k}" for k in range(n)])
                hub.bucket_faults[:] = [rng.choice([{"op": "copyFile", "status": 429, "retry_after": rng.randint(1, 5)},
                                                    {"op": "copyFile", "delay": rng.uniform(0.5, 4.0)},
                                                    {"op": "copyFile", "status": 503}])
                                        for _ in range(rng.randint(1, 3))]
                for q, (path, branch, _) in zip(queues, pushers):
                    q.put((path, branch))
                outcome = {(p, b): (kind, msg) for p, b, kind, msg in (results.get(timeout=300) for _ in range(n))}
                hub.bucket_faults[:] = []
                refs = {b.removeprefix("origin/"): c
                        for b, c in clone(url, tmp_path / f"reader-n{n}-t{trial}").remote_branches().items()}
                for path, branch, commit in pushers:
                    kind, msg = outcome[(path, branch)]
                    if kind == "won":
                        assert refs.get(branch) == commit, (n, trial, branch, outcome)
                    else:
                        assert kind in ("RemoteChanged", "NonFastForward", "RemoteError"), (kind, msg)
                assert any(kind == "won" for kind, _ in outcome.values()), outcome
                assert all(len(v) == 1 for v in _counting_confirmations(url).values())
        finally:
            _stop(queues, workers)


def _bucket_with_one_push(tmp_path, tag):
    url = f"hf://buckets/team/{tag}-{tmp_path.name}/m"
    repo = Repo.init(tmp_path / tag)
    save_file({"w": torch.zeros(64, 64)}, str(repo.root / "model.safetensors"))
    repo.commit("base")
    repo.remote_add("origin", url)
    repo.push()
    return repo, url


def _plant_entry(hub, url, name: str, body: bytes) -> None:
    """A confirmed ref-log entry as anyone with write access to the bucket could add it."""
    from huggingface_hub import HfApi

    from .conftest import TOKEN

    bucket, prefix = "/".join(url[len("hf://buckets/"):].split("/")[:2]), url.split("/", 5)[5]
    HfApi(endpoint=hub.base_url, token=TOKEN).batch_bucket_files(
        bucket, add=[(body, f"{prefix}/reflog/{name}.json"), (body, f"{prefix}/reflog/{name}.ok")])


def test_a_deeply_nested_ref_log_entry_is_malformed_not_a_recursion_error(tmp_path, hub):
    """Issue 49, item 6."""
    from .test_everyday import run

    repo, url = _bucket_with_one_push(tmp_path, "deep")
    _plant_entry(hub, url, "000000000005-0123456789abcdef", b'{"format": 1, "seq": 5, "refs": ' + b"[" * 100_000
                 + b"]" * 100_000 + b"}")
    for args, cwd in ((("clone", url, "c"), tmp_path), (("fetch",), repo.root), (("push",), repo.root)):
        r = run(cwd, *args, check=False)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 1 and lines and "ref log entry 000000000005-0123456789abcdef is malformed" in lines[-1], \
            r.stderr[-2000:]
        assert "RecursionError" not in r.stderr and "Traceback" not in r.stderr
    with pytest.raises(wvc.errors.WvcError, match="malformed"):
        wvc.follow(url).update(timeout=5)


def test_a_ref_log_entry_at_the_largest_twelve_digit_seq_does_not_wedge_pushes(tmp_path, hub):
    """Issue 49, item 8: the entry after 999999999999 has 13 digits."""
    import json

    repo, url = _bucket_with_one_push(tmp_path, "seq")
    refs = {"refs/heads/main": repo.head()}
    _plant_entry(hub, url, "999999999999-0123456789abcdef",
                 json.dumps({"format": 1, "seq": 999999999999, "prev": None, "refs": refs}).encode())
    for k in (1, 2):
        save_file({"w": torch.full((64, 64), float(k))}, str(repo.root / "model.safetensors"))
        repo.commit(f"after {k}")
        repo.push()
        assert clone(url, tmp_path / f"reader{k}").head() == repo.head()
    from wvc.remotes import open_backend

    remote = open_backend(url)
    remote.listing()
    assert remote.head.startswith("1000000000001-")


def test_a_bucket_listing_with_a_malformed_entry_is_one_clear_error(tmp_path, hub_env):
    """The listing is parsed by wvc (remotes/bucket.ListedFile), not huggingface_hub's objects:
    an entry of the wrong shape is the remote's fault, said in one line, not a traceback."""
    from wvc.errors import RemoteError
    from wvc.remotes import open_backend

    repo = Repo.init(tmp_path / "r")
    (tmp_path / "r" / "w.bin").write_bytes(b"x" * 100)
    repo.commit("one")
    url = f"hf://buckets/team/malformed-{tmp_path.name}"
    repo.remote_add("origin", url)
    repo.push("origin", "main")
    assert open_backend(url).listing().refs
    hub_env.buckets.put(f"team/malformed-{tmp_path.name}", "packs/odd.pack", {"xetHash": 7, "size": "big",
                                                                             "uploadedAt": None})
    with pytest.raises(RemoteError, match="malformed entry for 'packs/odd.pack'"):
        open_backend(url).listing()


def test_the_test_servers_bucket_operation_is_one_line_whatever_the_bucket_holds(tmp_path):
    """The local server's bucket store appends an operation instead of rewriting the bucket
    (which made every push slower as a run's retired files piled up: 0.107 -> 0.155 s over 300
    pushes, now flat), and a store opened again reads the same files back."""
    from wvc.testing.hub_buckets import BucketStore

    store = BucketStore(tmp_path)
    assert store.create("team/b", private=True)
    for i in range(2000):
        store.put("team/b", f"packs/{i}.pack", {"xetHash": f"{i:064x}", "size": i, "uploadedAt": None})
    header = (tmp_path / "buckets" / "team--b.json").read_bytes()
    log = tmp_path / "buckets" / "team--b.log"
    before = log.stat().st_size
    store.put("team/b", "packs/1.pack", None)
    assert (tmp_path / "buckets" / "team--b.json").read_bytes() == header  # the bucket is not rewritten
    assert log.read_bytes().count(b"\n") == 2001 and log.stat().st_size - before < 100
    again = BucketStore(tmp_path).load("team/b")
    assert again["private"] and len(again["files"]) == 1999 and "packs/1.pack" not in again["files"]
    assert again["files"]["packs/7.pack"]["size"] == 7
