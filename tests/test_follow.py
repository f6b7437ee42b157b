"""wvc.follow: a dict of tensors kept at a branch's tip, applying only what changed, exactly."""

import pytest
import torch
from safetensors.torch import save_file

import wvc
from wvc import Repo
from wvc.errors import CorruptObject, WvcError


class Publisher:
    """A bf16 model where each step moves ~1% of the elements by one unit in the last place,
    committed with deep chains (each step a delta against the one before) and pushed."""

    def __init__(self, root, remote, max_chain=1000):
        self.repo = Repo.init(root, max_chain=max_chain)
        g = torch.Generator().manual_seed(0)
        self.sd = {f"layer{i}.weight": (torch.randn(256, 512, generator=g) * 0.02).to(torch.bfloat16)
                   for i in range(4)}
        self.sd["norm.weight"] = torch.ones(512, dtype=torch.bfloat16)
        self.g = g
        self.repo.remote_add("origin", remote)

    def step(self, msg: str, touch=("layer0.weight", "layer2.weight")) -> tuple[str, int]:
        for name in touch:
            bits = self.sd[name].view(torch.int16).reshape(-1)
            idx = torch.randint(0, bits.numel(), (bits.numel() // 100,), generator=self.g)
            bits[idx] += 1
        save_file(self.sd, str(self.repo.root / "model.safetensors"))
        res = self.repo.commit(msg)
        self.repo.push()
        return res.commit, res.stored_bytes


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k].view(torch.int16), b[k].view(torch.int16)) for k in a)


@pytest.fixture
def publisher(tmp_path, monkeypatch):
    monkeypatch.setenv("WVC_CACHE", str(tmp_path / "cache"))
    return Publisher(tmp_path / "trainer", str(tmp_path / "remote"))


def test_a_follower_applies_each_step_exactly_downloading_about_the_step(publisher, tmp_path):
    first, _ = publisher.step("step 0")
    follower = wvc.follow("file://" + str(tmp_path / "remote"))
    up = follower.update()
    assert up.commit == first and up.parent is None and follower.commit == first
    assert same(follower.state_dict, publisher.repo.load_state_dict(first))
    assert follower.update() is None and follower.update(timeout=0) is None
    for k in range(1, 6):
        commit, stored = publisher.step(f"step {k}")
        up = follower.update()
        assert up.commit == commit and same(follower.state_dict, publisher.repo.load_state_dict(commit))
        assert up.changed == ["layer0.weight", "layer2.weight"]
        assert up.downloaded_bytes <= 1.25 * stored + 64 * 1024, (k, up.downloaded_bytes, stored)


def test_a_given_state_dict_is_updated_in_place_and_must_fit(publisher, tmp_path):
    commit, _ = publisher.step("step 0")
    mine = {n: torch.zeros_like(t) for n, t in publisher.sd.items()}
    tensors = dict(mine)
    follower = wvc.follow(publisher.repo.root, state_dict=mine)  # a local repository works too
    follower.update()
    assert all(mine[n] is tensors[n] for n in mine)  # the same tensor objects, new values
    assert same(mine, publisher.repo.load_state_dict(commit))
    bad = {n: torch.zeros_like(t) for n, t in publisher.sd.items() if n != "norm.weight"}
    bad["layer0.weight"] = torch.zeros(256, 512, dtype=torch.float32)
    with pytest.raises(WvcError, match="norm.weight missing.*|layer0.weight is"):
        wvc.follow(publisher.repo.root, state_dict=bad).update()
    assert all(float(t.abs().sum()) == 0 for t in bad.values())  # nothing written into it


def test_a_corrupt_payload_leaves_every_tensor_at_the_old_version_and_a_retry_completes(publisher, tmp_path):
    first, _ = publisher.step("step 0")
    follower = wvc.follow("file://" + str(tmp_path / "remote"))
    follower.update()
    before = {n: t.clone() for n, t in follower.state_dict.items()}
    second, _ = publisher.step("step 1", touch=("layer0.weight", "layer3.weight"))
    packs = sorted((tmp_path / "remote" / "packs").glob("*.pack"), key=lambda p: p.stat().st_mtime)
    newest = packs[-1]
    good = newest.read_bytes()
    corrupt = bytearray(good)
    for at in range(64, len(corrupt) - 200, 97):  # damage the new pack's payloads (its index intact)
        corrupt[at] ^= 0xFF
    newest.write_bytes(bytes(corrupt))
    with pytest.raises(CorruptObject):
        follower.update()
    assert follower.commit == first and same(follower.state_dict, before)  # all of them, none half-moved
    newest.write_bytes(good)
    up = follower.update()
    assert up.commit == second and same(follower.state_dict, publisher.repo.load_state_dict(second))


def test_pushes_and_a_follower_keep_within_hub_quotas_and_lose_nothing(tmp_path, hub_env, monkeypatch):
    """The local Hub enforces a commit quota and a request quota (the real Hub's limits in
    miniature): every push lands, every version reaches the follower exactly, and the
    server never admitted more than its quotas."""
    from wvc.testing.hub import Quota

    monkeypatch.setenv("WVC_CACHE", str(tmp_path / "cache"))
    hub_env.commit_quota = Quota(3, 2.0)  # 3 commits per 2 s
    hub_env.request_quota = Quota(40, 2.0)  # 40 requests per 2 s
    try:
        pub = Publisher(tmp_path / "trainer", f"hf://team/quota-{tmp_path.name}")
        follower = wvc.follow(f"hf://team/quota-{tmp_path.name}")
        commits = []
        for k in range(8):
            commit, _ = pub.step(f"step {k}")  # each step commits and pushes
            commits.append(commit)
            up = follower.update()
            assert up is not None and up.commit == commit
            assert same(follower.state_dict, pub.repo.load_state_dict(commit))
        assert hub_env.commit_quota.rejected + hub_env.request_quota.rejected > 0  # the quotas did bite
        assert hub_env.commit_quota.peak <= 3 and hub_env.request_quota.peak <= 40
    finally:
        hub_env.commit_quota = hub_env.request_quota = None


def test_a_poll_with_nothing_new_costs_one_small_request(tmp_path, hub_env, monkeypatch):
    monkeypatch.setenv("WVC_CACHE", str(tmp_path / "cache"))
    url = f"hf://team/poll-{tmp_path.name}"
    pub = Publisher(tmp_path / "trainer", url)
    pub.step("step 0")
    follower = wvc.follow(url)
    follower.update()
    before = len(hub_env.requests)
    assert follower.update() is None
    assert len(hub_env.requests) - before == 1, hub_env.requests[before:]
    commit, _ = pub.step("step 1")
    assert follower.update().commit == commit  # the poll sees the move, then the update reads what it needs


def test_an_update_with_a_short_timeout_waits_it_out_when_nothing_is_new(tmp_path, hub_env, monkeypatch):
    """``update(timeout=T)`` with nothing new returns after T, having polled once or twice: it
    returned at once when a poll and its back-off did not fit in T, so a loop of short updates
    polled as fast as it could and spent the Hub's request quota its publisher needed."""
    import time

    monkeypatch.setenv("WVC_CACHE", str(tmp_path / "cache"))
    url = f"hf://team/wait-{tmp_path.name}"
    Publisher(tmp_path / "trainer", url).step("step 0")
    follower = wvc.follow(url)
    follower.update()
    before, t = len(hub_env.requests), time.monotonic()
    for _ in range(3):
        assert follower.update(timeout=0.3) is None
    assert time.monotonic() - t >= 0.9
    assert len(hub_env.requests) - before <= 6, hub_env.requests[before:]  # a small request a poll


def test_an_update_reads_a_commits_new_payloads_in_one_request_per_pack(tmp_path, hub_env, monkeypatch):
    """One commit's new objects lie side by side in its pack: an update fetches them with
    one range request, not one per changed chunk (a round trip each on the real Hub)."""
    monkeypatch.setenv("WVC_CACHE", str(tmp_path / "cache"))
    url = f"hf://team/batch-{tmp_path.name}"
    pub = Publisher(tmp_path / "trainer", url)
    pub.step("step 0")
    follower = wvc.follow(url)
    follower.update()
    commit, _ = pub.step("step 1", touch=tuple(pub.sd))  # every tensor: five changed chunks
    before = len(hub_env.requests)
    update = follower.update()
    assert update.commit == commit and len(update.changed) == 5
    pack_reads = [r for r in hub_env.requests[before:] if ".pack" in r[1] and r[0] == "GET"]
    assert len(pack_reads) == 1, pack_reads
    assert same(follower.state_dict, pub.repo.load_state_dict(commit))


def test_a_re_anchored_step_downloads_its_delta_not_the_keyframe_again(tmp_path, monkeypatch):
    """With max_chain 1 every step is a delta against the chain's keyframe, which the
    follower's tensors no longer hold after the first step: it keeps the keyframes it
    decoded, so each update still downloads only that commit's payload."""
    monkeypatch.setenv("WVC_CACHE", str(tmp_path / "cache"))
    pub = Publisher(tmp_path / "trainer", str(tmp_path / "remote"), max_chain=1)
    pub.step("step 0")
    follower = wvc.follow("file://" + str(tmp_path / "remote"))
    follower.update()
    for k in range(1, 4):
        commit, stored = pub.step(f"step {k}")
        up = follower.update()
        assert same(follower.state_dict, pub.repo.load_state_dict(commit))
        assert up.downloaded_bytes <= 1.25 * stored + 64 * 1024, (k, up.downloaded_bytes, stored)


@pytest.mark.parametrize("own", [True, False])
def test_an_interrupt_while_applying_leaves_every_tensor_at_the_old_version(publisher, tmp_path, monkeypatch, own):
    """A KeyboardInterrupt (or any error) after some tensors were written: those get their
    old bytes back, so the follower still holds the old commit whole; the next update
    reaches the tip."""
    from wvc.read import follower as follower_module

    first, _ = publisher.step("step 0")
    given = None if own else {k: torch.zeros_like(v) for k, v in publisher.sd.items()}
    follower = wvc.follow("file://" + str(tmp_path / "remote"), state_dict=given)
    follower.update()
    before = {n: t.clone() for n, t in follower.state_dict.items()}
    second, _ = publisher.step("step 1", touch=("layer0.weight", "layer1.weight", "layer3.weight"))
    writes = []
    real = follower_module._write_chunk

    def interrupted(region, new):
        writes.append(1)
        if len(writes) == 3:  # two tensors written, the third interrupted
            raise KeyboardInterrupt
        real(region, new)

    monkeypatch.setattr(follower_module, "_write_chunk", interrupted)
    with pytest.raises(KeyboardInterrupt):
        follower.update()
    assert follower.commit == first and same(follower.state_dict, before)
    monkeypatch.setattr(follower_module, "_write_chunk", real)
    assert follower.update().commit == second
    assert same(follower.state_dict, publisher.repo.load_state_dict(second))


def test_a_run_publishing_every_step_under_hub_quotas_loses_nothing(tmp_path, hub_env, monkeypatch):
    """A run commits every step through wvc.integrations.publisher with the Hub's quotas on (in
    miniature: 3 commits and 40 requests per 2 s) while a follower polls: every step is
    committed locally, pushes coalesce to the rate, every version the follower reaches is
    bit-exact, nothing failed for good, and the server never admitted more than its quotas."""
    import threading

    from wvc.integrations.publisher import Publisher as BackgroundPublisher
    from wvc.testing.hub import Quota

    monkeypatch.setenv("WVC_CACHE", str(tmp_path / "cache"))
    url = f"hf://team/run-{tmp_path.name}"
    hub_env.commit_quota = Quota(3, 2.0)
    hub_env.request_quota = Quota(40, 2.0)
    seen, done = [], threading.Event()
    try:
        pub = BackgroundPublisher(tmp_path / "trainer", "main", push_to=url, push_interval=1.0, max_pending=100)

        def follow():
            follower = wvc.follow(url)
            while True:
                finished = done.is_set()
                up = follower.update(timeout=0.5)
                if up is not None:
                    seen.append((up.commit, {k: v.clone() for k, v in follower.state_dict.items()}))
                elif finished:
                    return

        thread = threading.Thread(target=follow)
        thread.start()
        g = torch.Generator().manual_seed(0)
        sd = {f"w{i}": (torch.randn(256, 512, generator=g) * 0.02).to(torch.bfloat16) for i in range(3)}
        for step in range(30):
            sd["w1"].view(torch.int16).reshape(-1)[step::50] += 1
            pub.publish(sd, message=f"step {step}", metadata={"step": step})
        assert pub.close(timeout=120), pub.errors
        done.set()
        thread.join(timeout=120)
        assert not thread.is_alive()
        repo = Repo.open(tmp_path / "trainer")
        log = repo.log("main")
        assert [e.metadata["step"] for e in log] == list(range(29, -1, -1))  # every step committed
        assert seen and seen[-1][0] == log[0].id  # the follower reached the last step
        for commit, tensors in seen:
            assert same(tensors, repo.load_state_dict(commit))
        assert hub_env.commit_quota.peak <= 3 and hub_env.request_quota.peak <= 40
        assert not [e for e in pub.errors if "giving up" in e] and not pub.unpushed
    finally:
        hub_env.commit_quota = hub_env.request_quota = None


def test_kept_keyframes_stay_within_their_budget(tmp_path, monkeypatch):
    """A tensor rewritten whole every step leaves a new keyframe each time; the old ones
    are dropped, least recently used first, beyond the budget (here once the weights)."""
    from wvc.read import follower as follower_module

    monkeypatch.setattr(follower_module, "KEYFRAME_BUDGET", 1)
    monkeypatch.setenv("WVC_CACHE", str(tmp_path / "cache"))
    pub = Publisher(tmp_path / "trainer", str(tmp_path / "remote"), max_chain=1)
    follower = wvc.follow("file://" + str(tmp_path / "remote"))
    weights = sum(t.numel() * t.element_size() for t in pub.sd.values())
    for k in range(8):
        pub.sd["layer1.weight"] = (torch.randn(256, 512, generator=pub.g) * 0.02).to(torch.bfloat16)  # no delta
        commit, _ = pub.step(f"step {k}")
        follower.update()
        assert same(follower.state_dict, pub.repo.load_state_dict(commit))
    kept = sum(p.stat().st_size for p in follower._keyframes.root.iterdir())
    assert 0 < kept <= weights


def test_a_follower_started_at_the_version_it_holds_reads_one_step_not_the_model(tmp_path, monkeypatch):
    """follow(..., state_dict=, at=commit): an engine started from a checkout of ``commit``
    follows on from it (issue 50: the first update re-downloaded the whole version)."""
    from safetensors.torch import load_file

    from wvc.errors import InvalidArgument

    monkeypatch.setenv("WVC_CACHE", str(tmp_path / "cache"))
    repo = wvc.Repo.init(tmp_path / "src")
    g = torch.Generator().manual_seed(0)
    sd = {f"layer.{i}.weight": (torch.randn(512, 512, generator=g) * 0.02).to(torch.bfloat16) for i in range(8)}
    remote = tmp_path / "remote"
    repo.remote_add("origin", str(remote))
    commits = []
    for s in range(4):
        for v in sd.values():
            idx = torch.randint(0, v.numel(), (v.numel() // 30,), generator=g)
            v.view(-1)[idx] += (torch.randn(idx.numel(), generator=g) * 1e-4).to(torch.bfloat16)
        commits.append(repo.commit(f"s{s}", sd).commit)
        repo.push()
    model = sum(v.numel() * v.element_size() for v in sd.values())
    along = wvc.follow(str(remote))
    along.update(rev=commits[2])
    step = along.update().downloaded_bytes  # what a follower that followed all along reads
    repo.checkout(commits[2], output=tmp_path / "c2")
    held = load_file(str(tmp_path / "c2" / "model.safetensors"))
    started = wvc.follow(str(remote), state_dict=held, at=commits[2])
    update = started.update()
    assert update.commit == commits[3] and update.parent == commits[2]
    assert update.downloaded_bytes <= 2 * step and update.downloaded_bytes < 0.05 * model, (update, step, model)
    assert all(torch.equal(held[k].view(torch.int16), sd[k].view(torch.int16)) for k in sd)
    # a state dict that does not hold that version is refused before anything is read or written
    wrong = load_file(str(tmp_path / "c2" / "model.safetensors"))
    wrong["layer.3.weight"].view(-1)[7] += 1
    before = {k: v.clone() for k, v in wrong.items()}
    with pytest.raises(InvalidArgument, match="does not hold"):
        wvc.follow(str(remote), state_dict=wrong, at=commits[2]).update()
    assert all(torch.equal(wrong[k], before[k]) for k in wrong)
    with pytest.raises(InvalidArgument, match="state_dict"):
        wvc.follow(str(remote), at=commits[2])


def _changed_indices(before: dict, after: dict, name: str):
    a, b = before[name].reshape(-1).view(torch.int16), after[name].reshape(-1).view(torch.int16)
    return torch.nonzero(a != b).reshape(-1)


def test_patches_name_exactly_the_elements_each_update_changed(publisher, tmp_path):
    """follow(..., patches=True): each update's patches are the flat indices of the elements
    whose bits changed, one step or several steps at once (their union)."""
    first, _ = publisher.step("step 0")
    follower = wvc.follow("file://" + str(tmp_path / "remote"), patches=True)
    up = follower.update()
    assert up.patches == {name: None for name in publisher.sd}  # the first version: all of it is new
    held = first
    for steps in (1, 3):  # one step, then three steps in one update (step records chained)
        commits = [publisher.step(f"step to {k}", touch=("layer1.weight",) if k == 1 else ("layer0.weight", "layer2.weight"))[0]
                   for k in range(steps)]
        up = follower.update()
        assert up.commit == commits[-1]
        before, after = publisher.repo.load_state_dict(held), publisher.repo.load_state_dict(commits[-1])
        assert sorted(up.patches) == up.changed
        for name, idx in up.patches.items():
            assert torch.equal(idx, _changed_indices(before, after, name)), name
            flat = follower.state_dict[name].reshape(-1)
            assert torch.equal(flat[idx].view(torch.int16), after[name].reshape(-1)[idx].view(torch.int16))
        assert same(follower.state_dict, after)
        held = commits[-1]


def test_an_update_to_a_named_commit_reads_its_step_records_across_an_anchor(tmp_path, monkeypatch):
    """``update(rev=COMMIT)`` (what a vLLM server's ``/update_weights {"commit": ...}`` asks)
    moves by the step records like ``update()`` does: at an anchor step (every 4th, stored
    against the version 4 back) it reads that step's change, not the anchor's drift. Found by
    benchmarks/vllm_sync.py: step 4 read 101 MB of a 148 MB model, the other steps 1.3 MB."""
    from benchmarks.cases import adam_step, init_weights

    monkeypatch.setenv("WVC_CACHE", str(tmp_path / "cache"))
    repo = wvc.Repo.init(tmp_path / "src")
    remote = tmp_path / "remote"
    repo.remote_add("origin", str(remote))
    master = init_weights({f"layer.{i}.weight": (256, 1024) for i in range(6)}, seed=0)
    g = torch.Generator().manual_seed(1)
    bf16 = lambda: {k: v.to(torch.bfloat16) for k, v in master.items()}  # noqa: E731
    repo.commit("s0", bf16())
    repo.push()
    by_tip, by_name = wvc.follow(str(remote)), wvc.follow(str(remote))
    by_tip.update(), by_name.update()
    for step in range(1, 7):
        adam_step(master, g, 1e-6)
        sd = bf16()
        commit = repo.commit(f"s{step}", sd).commit
        repo.push()
        tip, named = by_tip.update(), by_name.update(rev=commit)
        assert named.commit == tip.commit == commit and named.changed == tip.changed
        assert named.downloaded_bytes <= 1.1 * tip.downloaded_bytes, (step, named.downloaded_bytes, tip.downloaded_bytes)
        assert all(torch.equal(by_name.state_dict[k].view(torch.int16), sd[k].view(torch.int16)) for k in sd)
    assert by_name.update(rev=commit) is None  # already there: nothing read, nothing changed
