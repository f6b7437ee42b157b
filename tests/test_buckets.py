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
    from wvc.publisher import Publisher
    from wvc.remotes import open_remote

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
    remote = open_remote(url)
    remote.state()
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
            outcome = dict((path, (kind, msg)) for path, kind, msg in (results.get(timeout=180) for _ in range(2)))
            kinds = sorted(kind for kind, _ in outcome.values())
            assert kinds == ["NonFastForward", "won"], (trial, outcome)
            winner = next(p for p, (kind, _) in outcome.items() if kind == "won")
            loser = next(p for p, (kind, _) in outcome.items() if kind != "won")
            from wvc.remotes import open_remote

            assert open_remote(url).state().refs["refs/heads/main"] == mine[winner]
            for path, commit in mine.items():  # both commits are still there locally
                with Repo.open(path) as repo:
                    assert repo.refs.head_commit() == commit
            with Repo.open(loser) as repo:  # and the loser can pull and push on top
                repo.pull(rebase=True)
                repo.push()
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
    head = repo.refs.head_commit()
    # how many requests one push makes
    save_file({"w": torch.ones(256, 256)}, str(repo.root / "model.safetensors"))
    repo.commit("probe")
    before = len(hub.requests)
    repo.push()
    per_push = len(hub.requests) - before
    head = repo.refs.head_commit()
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
        assert state.refs.head_commit() in (head, new) and state.fsck().ok
        with Repo.open(tmp_path / "m") as r:
            r.push()  # completes (a leftover proposal is stale after WVC_BUCKET_STALE_SECONDS)
        again = clone(url, tmp_path / f"after{k}")
        assert again.refs.head_commit() == new and tree_digests(again.root) == tree_digests(tmp_path / "m")
        head = new
