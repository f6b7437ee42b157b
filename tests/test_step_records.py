"""Step records (remotes/step_records.py): a follower's bytes a step are that step's change, also on
the steps where the publisher re-anchors a chain (whose stored payload carries the drift
since its anchor), and an update reads no listing and no catalog."""

import os
import statistics
from pathlib import Path

import pytest
import safetensors.torch
import torch

import wvc
from wvc.remotes.layout import commit_of_step_path, step_path
from wvc import Repo
from wvc.read import follower as follower_module
from wvc.remotes import open_backend, step_records
from wvc.remotes.repository import RemoteRepository

from .test_follow import same


class Run:
    """A 1 MiB bf16 tensor where 2.5% of the elements move a step (an optimizer's drift), a
    commit and a push a step; the default anchor policy (store/anchors.py: every 4th step a
    delta against an anchor further back)."""

    def __init__(self, root, url, n=1 << 19):
        self.repo = Repo.init(root)
        self.repo.remote_add("origin", url)
        self.g = torch.Generator().manual_seed(0)
        self.w = torch.randn(n, generator=self.g).to(torch.bfloat16)
        self.url = url
        self.pushing = False  # while step() pushes (what tests count as a push's work)

    def move(self) -> None:
        idx = torch.randint(0, self.w.numel(), (self.w.numel() // 40,), generator=self.g)
        self.w[idx] += torch.randn(idx.numel(), generator=self.g).to(torch.bfloat16) * 1e-2

    def step(self, i: int) -> str:
        if i:
            self.move()
        commit = self.repo.commit(f"step {i}", source={"w": self.w.clone()}, branch="main").commit
        self.pushing = True
        try:
            self.repo.push()
        finally:
            self.pushing = False
        return commit

    def reanchored(self, commit: str) -> bool:
        """Whether the commit's chunk is stored against something other than its parent's."""
        parent = self.repo.read_commit(commit).parents[0]
        new, old = (self.repo.tree_of(c).files[0].tensors[0].chunks for c in (commit, parent))
        return any(self.repo.internals.store.row(x).base != p for x, p in zip(new, old) if x != p)


class AdamRun(Run):
    """A Run whose steps move the same 2.5% of the elements each step, each mostly by one unit
    in the last place the same way (Adam's moments at a small learning rate): what the step
    coders are for (codec/step_coder.py), so its payloads are step payloads."""

    def __init__(self, root, url, n=1 << 19):
        super().__init__(root, url, n)
        self.w = self.w.abs()  # (positive: a unit up is +1 on the bits)
        self.active = torch.randperm(n, generator=self.g)[: n // 40]
        self.way = torch.randint(0, 2, (self.active.numel(),), generator=self.g, dtype=torch.int16) * 2 - 1

    def move(self) -> None:
        moves = torch.rand(self.active.numel(), generator=self.g) < 0.85
        self.w.view(torch.int16)[self.active[moves]] += self.way[moves]


def count_push_work(monkeypatch, pushing) -> dict:
    """Counts, from now on, the chain links decoded while ``pushing()`` and the step payloads
    a push's records code (remotes/step_record_writer.py): what a long-lived writer's push should
    leave to its commit."""
    import wvc.remotes.step_record_writer as records_module
    import wvc.store.chunks as chunks_module

    work = {"decoded": 0, "coded": 0}
    real_decode, real_encode = chunks_module.decode_links, records_module.encode

    def decoding(links, *args, **kwargs):
        work["decoded"] += len(links) if pushing() else 0
        return real_decode(links, *args, **kwargs)

    def encoding(*args, **kwargs):
        work["coded"] += 1
        return real_encode(*args, **kwargs)

    monkeypatch.setattr(chunks_module, "decode_links", decoding)
    monkeypatch.setattr(records_module, "encode", encoding)
    return work


def forbid_ordinary_reads(monkeypatch) -> None:
    """From now on a follower that reads a version the ordinary way (no record) fails."""
    import wvc.read.follower as module

    def no_ordinary_read(*args, **kwargs):
        raise AssertionError("the follower read a version the ordinary way: no record for it")

    monkeypatch.setattr(module, "open_remote_version", no_ordinary_read)


pytestmark = pytest.mark.usefixtures("hub_env")


def record_names(url: str) -> list[str]:
    return sorted(p for p in open_backend(url).listing().files if commit_of_step_path(p))


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("WVC_CACHE", str(tmp_path / "cache"))


def test_a_followers_step_costs_the_same_on_re_anchored_steps(tmp_path, remote_url, monkeypatch):
    run = Run(tmp_path / "run", remote_url)
    run.step(0)
    follower = wvc.follow(remote_url)
    follower.update()
    import wvc.read.follower as module

    def no_ordinary_read(*args, **kwargs):
        raise AssertionError("the follower listed the remote and read catalogs")

    monkeypatch.setattr(module, "open_remote_version", no_ordinary_read)
    got, anchors = {}, []
    for i in range(1, 19):
        commit = run.step(i)
        update = follower.update()
        assert update.commit == commit and same(follower.state_dict, run.repo.load_state_dict(commit))
        got[i] = update.downloaded_bytes
        if run.reanchored(commit):
            anchors.append(i)
    assert anchors, "the run never re-anchored: the test shows nothing"
    median = statistics.median(got.values())
    assert max(got.values()) <= 2 * median, (got, anchors)
    stored = {i: e.stored_bytes for i, e in zip(range(18, 0, -1), run.repo.log())}
    assert any(stored[i] > 3 * median for i in anchors), (stored, anchors)  # what it would have downloaded
    assert len(record_names(remote_url)) <= step_records.KEEP


def test_step_context_survives_a_re_anchor_for_followers(tmp_path):
    """Correlated steps (the same elements move again, by one unit: what the step coders code given
    the step before): a re-anchored chunk's stored payload has lost that context, its step
    payload in the record keeps it, so the re-anchored step and the one after cost a step."""
    from wvc.codec import Method

    url = str(tmp_path / "remote")
    run = Run(tmp_path / "run", url)
    run.w = (run.w * 0.02).to(torch.bfloat16)
    hot = torch.randint(0, run.w.numel(), (run.w.numel() // 20,), generator=run.g)

    def step(i):
        if i:
            bits = run.w.view(torch.int16)
            bits[hot[torch.rand(hot.numel(), generator=run.g) < 0.5]] += 1
        commit = run.repo.commit(f"step {i}", source={"w": run.w.clone()}, branch="main").commit
        run.repo.push()
        return commit

    step(0)
    follower = wvc.follow(url)
    follower.update()
    got, anchors, contexts = {}, [], 0
    for i in range(1, 20):
        commit = step(i)
        update = follower.update()
        assert same(follower.state_dict, run.repo.load_state_dict(commit))
        got[i] = update.downloaded_bytes
        record = step_records.parse((tmp_path / "remote" / step_path(commit)).read_bytes(), commit)
        contexts += sum(c.context is not None and c.pack is None for c in record.chunks)
        if run.reanchored(commit):
            anchors.append(i)
    assert anchors and contexts  # step payloads coded with their context rode in records
    median = statistics.median(got.values())
    for i in anchors:
        assert got[i] <= 1.3 * median and got.get(i + 1, median) <= 1.3 * median, (got, anchors)
    methods = {Method(run.repo.internals.store.row(run.repo.tree_of(e.id).files[0].tensors[0].chunks[0]).method)
               for e in run.repo.log()}
    assert methods & {Method.STEP_BLOCKS, Method.STEP_RUNS}  # the case this is about


def test_a_keyframe_written_when_a_chain_outweighs_it_reaches_a_follower_as_its_step(tmp_path):
    """When the deltas of the base's chain outweigh its keyframe, a chunk is encoded against
    the keyframe, or stored whole when that is smaller: after two steps that each replaced
    70% of the elements, the next small step is stored as a keyframe. A follower holding the
    parent gets that step's own change, not the keyframe."""
    url = str(tmp_path / "remote")
    repo = Repo.init(tmp_path / "run")
    repo.remote_add("origin", url)
    g = torch.Generator().manual_seed(1)
    n = 1 << 17
    w = torch.randn(n, generator=g).to(torch.bfloat16)
    follower = None
    for i, part in enumerate([None, slice(0, 7 * n // 10), slice(3 * n // 10, n), slice(0, n, 64)]):
        if part == slice(0, n, 64):
            w[part] += 1e-2  # a small step; the chain's deltas (2 x 70%) outweigh the keyframe
        elif part is not None:
            w[part] = torch.randn(w[part].numel(), generator=g).to(torch.bfloat16)  # 70% replaced
        commit = repo.commit(f"step {i}", source={"w": w.clone()}).commit
        repo.push()
        follower = follower or wvc.follow(url)
        update = follower.update()
        assert update.commit == commit and same(follower.state_dict, repo.load_state_dict(commit))
    chunk = repo.tree_of(commit).files[0].tensors[0].chunks[0]
    assert repo.internals.store.row(chunk).base is None  # stored whole: the case this is about
    record = step_records.parse((tmp_path / "remote" / step_path(commit)).read_bytes(), commit)
    assert [c.pack for c in record.chunks] == [None]  # a step payload, in the record
    assert update.downloaded_bytes < 0.25 * repo.internals.store.row(chunk).length


def test_a_follower_that_fell_behind_catches_up_by_records(tmp_path, monkeypatch):
    url = str(tmp_path / "remote")
    run = Run(tmp_path / "run", url)
    run.step(0)
    follower = wvc.follow(url)
    follower.update()
    commits = [run.step(i) for i in range(1, 5)]
    import wvc.read.follower as module

    monkeypatch.setattr(module, "open_remote_version", lambda *a, **k: pytest.fail("read the ordinary way"))
    update = follower.update()
    assert update.commit == commits[-1] and update.changed == ["w"]
    assert same(follower.state_dict, run.repo.load_state_dict(commits[-1]))
    stored = sum(e.stored_bytes for e in run.repo.log()[:4])
    assert update.downloaded_bytes <= 1.2 * stored + 16 * 1024


@pytest.mark.parametrize("damage", ["missing", "garbage", "payload", "truncated"])
def test_a_missing_or_damaged_record_falls_back_to_the_ordinary_read(tmp_path, damage):
    url = str(tmp_path / "remote")
    run = Run(tmp_path / "run", url)
    run.step(0)
    follower = wvc.follow(url)
    follower.update()
    for i in range(1, 20):  # up to a step that re-anchors: its record carries a step payload
        commit = run.step(i)
        if run.reanchored(commit):
            break
        follower.update()
    assert run.reanchored(commit)
    path = tmp_path / "remote" / step_path(commit)
    data = path.read_bytes()
    record = step_records.parse(data, commit)
    carried = [c for c in record.chunks if c.pack is None]
    assert carried  # a step payload rides in the record
    if damage == "missing":
        path.unlink()
    elif damage == "garbage":
        path.write_bytes(os.urandom(len(data)))
    elif damage == "truncated":
        path.write_bytes(data[: len(data) // 2])
    else:  # a flipped bit in the step payload: it decodes to other bytes, or not at all
        start = len(data) - len(record.data) + carried[0].offset + carried[0].length // 2
        path.write_bytes(data[:start] + bytes([data[start] ^ 1]) + data[start + 1 :])
    update = follower.update()
    assert update.commit == commit and same(follower.state_dict, run.repo.load_state_dict(commit))
    nxt = run.step(i + 1)  # and the next step is by record again
    assert follower.update().commit == nxt and same(follower.state_dict, run.repo.load_state_dict(nxt))


def test_step_records_are_refused_when_malformed(tmp_path):
    from wvc.errors import CorruptObject

    url = str(tmp_path / "remote")
    run = Run(tmp_path / "run", url, n=1 << 12)
    run.step(0)
    commit = run.step(1)
    data = (tmp_path / "remote" / step_path(commit)).read_bytes()
    assert step_records.parse(data, commit).commit == commit
    with pytest.raises(CorruptObject):
        step_records.parse(data, run.repo.resolve("main~1"))  # read for another commit
    import struct

    import zstandard

    bomb = zstandard.ZstdCompressor().compress(b"{" * (step_records.MAX_HEADER + 1))
    for bad in (b"", step_records.MAGIC, step_records.MAGIC + struct.pack("<Q", 1 << 40),
                step_records.MAGIC + struct.pack("<Q", len(bomb)) + bomb,  # a header past its bound
                data[:-1]):  # the data area one byte short of what the header says
        with pytest.raises(CorruptObject):
            step_records.parse(bad, commit)


def test_pushing_another_branch_keeps_mains_records(tmp_path):
    url = str(tmp_path / "remote")
    run = Run(tmp_path / "run", url, n=1 << 12)
    for i in range(4):
        run.step(i)
    before = record_names(url)
    assert len(before) == 3  # the root has no parent to step from
    run.repo.create_branch("exp")
    for i in range(step_records.KEEP + 2):
        run.repo.commit(f"exp {i}", source={"w": run.w + (i + 1)}, branch="exp")
    run.repo.push(branch="exp")
    after = record_names(url)
    assert set(before) <= set(after) and len(after) == len(before) + step_records.KEEP


def test_gc_remote_drops_records_of_unreachable_commits(tmp_path, remote_url):
    url = remote_url
    run = Run(tmp_path / "run", url, n=1 << 12)
    for i in range(3):
        run.step(i)
    run.repo.create_branch("exp")
    run.repo.commit("exp 1", source={"w": run.w + 1}, branch="exp")
    run.repo.commit("exp 2", source={"w": run.w + 2}, branch="exp")
    run.repo.push(branch="exp")
    exp_records = set(record_names(url)) - {step_path(c) for c in
                                            [run.repo.resolve("main"), run.repo.resolve("main~1")]}
    assert len(exp_records) == 2
    run.repo.delete_remote_branch("origin", "exp")
    run.repo.remote_gc("origin")
    left = set(record_names(url))
    assert not left & exp_records
    follower = wvc.follow(url)  # main still follows, by records
    follower.update()
    commit = run.step(3)
    assert follower.update().commit == commit and same(follower.state_dict, run.repo.load_state_dict(commit))


def test_blob_changes_go_by_record_and_a_new_file_by_the_ordinary_read(tmp_path):
    from safetensors.torch import save_file

    url = str(tmp_path / "remote")
    repo = Repo.init(tmp_path / "run")
    repo.remote_add("origin", url)
    w = torch.randn(1 << 14).to(torch.bfloat16)
    save_file({"w": w}, str(repo.root / "model.safetensors"))
    (repo.root / "config.json").write_text('{"lr": 0.001}')
    repo.commit("0")
    repo.push()
    follower = wvc.follow(url)
    follower.update()
    (repo.root / "config.json").write_text('{"lr": 0.002}')  # same size: a chunk-id change
    w[:100] += 1
    save_file({"w": w}, str(repo.root / "model.safetensors"))
    one = repo.commit("1").commit
    repo.push()
    assert (tmp_path / "remote" / step_path(one)).exists()
    assert follower.update().commit == one and same(follower.state_dict, repo.load_state_dict(one))
    (repo.root / "tokenizer.json").write_text("{}")  # a new file: no record, the usual read
    w[:100] += 1
    save_file({"w": w}, str(repo.root / "model.safetensors"))
    two = repo.commit("2").commit
    repo.push()
    assert not (tmp_path / "remote" / step_path(two)).exists()
    assert follower.update().commit == two and same(follower.state_dict, repo.load_state_dict(two))


def test_a_record_reads_only_its_own_bytes_and_the_payloads_it_names(tmp_path):
    """Tensors that change at different rates re-anchor at different steps, so a record
    carries some step payloads and names scattered stored ones: the follower reads those
    ranges, not the gaps between them. (The real run's replay, where reads through 256 KB
    gaps took 4x the step at re-anchors, is MiniLM-sized; this small layout bounds the
    property without reproducing that case.)"""
    url = str(tmp_path / "remote")
    repo = Repo.init(tmp_path / "run")
    repo.remote_add("origin", url)
    g = torch.Generator().manual_seed(0)
    sd = {f"t{i}": torch.randn(1 << 15, generator=g).to(torch.bfloat16) for i in range(24)}
    sd["big"] = torch.randn(1 << 20, generator=g).to(torch.bfloat16)  # its re-anchored payload lies between

    def step(i):
        for k, (name, t) in enumerate(sd.items()):
            if i and (name == "big" or i % (k % 3 + 1) == 0):
                t[torch.randint(0, t.numel(), (t.numel() // 40,), generator=g)] += 0.01
        commit = repo.commit(f"step {i}", source={n: t.clone() for n, t in sd.items()}, branch="main").commit
        repo.push()
        return commit

    step(0)
    follower = wvc.follow(url)
    follower.update()
    mixed = 0
    for i in range(1, 26):
        commit = step(i)
        update = follower.update()
        assert same(follower.state_dict, repo.load_state_dict(commit))
        path = tmp_path / "remote" / step_path(commit)
        record = step_records.parse(path.read_bytes(), commit)
        named = sum(c.length for c in record.chunks if c.pack is not None)
        mixed += any(c.pack is None for c in record.chunks) and named > 0
        ref = len((tmp_path / "remote" / "refs" / "heads" / "main").read_bytes())
        assert update.downloaded_bytes <= ref + path.stat().st_size + named + 1024 * len(record.chunks), i
    assert mixed  # records that carried step payloads and named stored ones


def test_a_push_after_a_plain_commit_decodes_what_the_push_before_decoded_once(tmp_path, monkeypatch):
    """Step payloads need the chunk, its parent's and the grandparent's bytes. Without a
    Publisher keeping raw chunks, each push decoded those chains again; the chunks recent
    pushes decoded are kept (bounded), so a long run's pushes decode a link or so a chunk."""
    import wvc.store.chunks as chunks_module

    def links_decoded(root, recent_bytes: int) -> int:
        monkeypatch.setattr(chunks_module, "RECENT_DECODED_BYTES", recent_bytes)
        run = Run(root, str(root.parent / f"{root.name}-remote"))
        counted = [0]
        real = chunks_module.decode_links

        def counting(links, *args, **kwargs):
            counted[0] += len(links) if run.pushing else 0
            return real(links, *args, **kwargs)

        monkeypatch.setattr(chunks_module, "decode_links", counting)
        for i in range(24):
            if i == 8:  # chains are deep by now
                counted[0] = 0
            run.step(i)
        monkeypatch.setattr(chunks_module, "decode_links", real)
        return counted[0]

    default = chunks_module.RECENT_DECODED_BYTES
    without = links_decoded(tmp_path / "a", 0)
    kept = links_decoded(tmp_path / "b", default)
    assert without > 0 and kept <= without / 2, (kept, without)


def test_a_long_lived_writers_pushes_code_and_decode_nothing_and_followers_stay_exact(tmp_path, monkeypatch):
    """A writer that keeps its recent chunks (the Publisher, the TRL transfer) codes each
    step payload at commit time, where the chunk, its parent's and its grandparent's bytes
    are in hand; the push only sends it. Built at push time, an anchor step's record decoded
    the grandparent's chain and coded the payload there, serially: its push took 30x a plain
    step's, and grew with the anchor's depth (issue 65)."""
    run = Run(tmp_path / "run", str(tmp_path / "remote"))
    run.repo.internals.store.keep_recent(1 << 30)
    work = count_push_work(monkeypatch, lambda: run.pushing)
    run.step(0)
    follower = wvc.follow(str(tmp_path / "remote"))
    follower.update()
    forbid_ordinary_reads(monkeypatch)
    anchors = []
    for i in range(1, 14):
        commit = run.step(i)
        update = follower.update()
        assert update.commit == commit and same(follower.state_dict, run.repo.load_state_dict(commit))
        anchors += [i] if run.reanchored(commit) else []
    assert anchors, "the run never re-anchored: the test shows nothing"
    assert work == {"decoded": 0, "coded": 0}, (work, anchors)


def test_a_follower_keeps_of_the_version_before_only_what_changed(tmp_path, monkeypatch):
    """What an update replaced is kept for its undo and as the next step's context (a step
    payload is coded against the version before): the changed elements and their old values,
    ~10% of the model's bytes at an RL step's 2.5%, not a copy of every chunk (a second copy
    of the model in a following engine, issue 65). The next steps decode against it exactly,
    and an update interrupted midway puts the old elements back."""
    from wvc.read import follower as follower_module

    run = Run(tmp_path / "run", str(tmp_path / "remote"), n=1 << 20)
    run.step(0)
    follower = wvc.follow(str(tmp_path / "remote"))
    follower.update()
    model_bytes = sum(t.numel() * t.element_size() for t in follower.state_dict.values())

    def no_ordinary_read(*args, **kwargs):
        raise AssertionError("the follower read a version the ordinary way: a record's context was not held")

    monkeypatch.setattr(follower_module, "open_remote_version", no_ordinary_read)
    for i in range(1, 7):
        commit = run.step(i)
        assert follower.update().commit == commit and same(follower.state_dict, run.repo.load_state_dict(commit))
        held = sum(old.nbytes for old in follower._previous.values())
        assert 0 < held <= 0.15 * model_bytes, (i, held, model_bytes)
    before = {k: v.clone() for k, v in follower.state_dict.items()}
    last = follower.commit
    run.step(7)
    real, writes = follower_module._write_chunk, []

    def interrupted(region, new):
        writes.append(1)
        real(region, new)
        if len(writes) == 1:  # a chunk written whole, then the interrupt
            raise KeyboardInterrupt

    monkeypatch.setattr(follower_module, "_write_chunk", interrupted)
    with pytest.raises(KeyboardInterrupt):
        follower.update()
    assert follower.commit == last and same(follower.state_dict, before)
    monkeypatch.setattr(follower_module, "_write_chunk", real)
    commit = run.step(8)
    assert follower.update().commit == commit and same(follower.state_dict, run.repo.load_state_dict(commit))


def test_a_followers_step_decodes_its_chunks_on_the_codec_pool_and_finds_what_changed_there(tmp_path, monkeypatch):
    """A step's chunks are decoded, and each write's replaced elements found, side by side on
    the codec pool (wvc-codec threads), not one after another on the caller's thread: the
    decode was most of a CPU engine's update, at one core (issue 65)."""
    import threading

    from wvc.read import follower as follower_module

    run = Run(tmp_path / "run", str(tmp_path / "remote"), n=1 << 19)
    run.step(0)
    follower = wvc.follow(str(tmp_path / "remote"))
    follower.update()
    threads = {"decode": set(), "replaced": set()}
    real_call, real_of = follower_module._RecordChunks.__call__, follower_module._OldBytes.of.__func__

    def call(self, oid):
        threads["decode"].add(threading.current_thread().name)
        return real_call(self, oid)

    def of(cls, region, new, width):
        threads["replaced"].add(threading.current_thread().name)
        return real_of(cls, region, new, width)

    monkeypatch.setattr(follower_module._RecordChunks, "__call__", call)
    monkeypatch.setattr(follower_module._OldBytes, "of", classmethod(of))
    commit = run.step(1)
    assert follower.update().commit == commit and same(follower.state_dict, run.repo.load_state_dict(commit))
    assert threads["decode"] and all(name.startswith("wvc-codec") for name in threads["decode"]), threads
    assert threads["replaced"] and all(name.startswith("wvc-codec") for name in threads["replaced"]), threads


def test_a_followers_step_is_decoded_over_the_held_bytes_and_writes_only_the_elements_it_changes(tmp_path,
                                                                                              monkeypatch):
    """A step payload is decoded straight over the bytes the follower holds, in the context it
    kept of the version before (the elements that changed and their old values), and the
    decoder says which elements it changed: no chunk is copied out of the state dict, no
    context rebuilt whole, no chunk compared with its new bytes, and only the changed
    elements are written (what made a CPU engine's fetch scale with the model, issue 65)."""
    from wvc.read import follower as follower_module

    run = AdamRun(tmp_path / "run", str(tmp_path / "remote"), n=1 << 19)
    run.step(0)
    follower = wvc.follow(str(tmp_path / "remote"))
    follower.update()
    run.step(1)
    follower.update()  # (the first step's context, the version before the first held, was never held)

    def copied(*args, **kwargs):
        raise AssertionError("a chunk was copied out of the state dict, or a context rebuilt whole")

    monkeypatch.setattr(follower_module._Held, "__getitem__", copied)
    monkeypatch.setattr(follower_module._OldBytes, "bytes", copied)
    monkeypatch.setattr(follower_module, "_changed_elements", copied)
    real_nonzero, written = torch.nonzero, []

    def no_compare(*args, **kwargs):
        raise AssertionError("the elements a write changes were found by comparing the chunks")

    def write(region, new):
        written.append(new.values.numel() if isinstance(new, follower_module._Changed) else "whole")
        follower_module._Changed.write(new, region) if isinstance(new, follower_module._Changed) else region.copy_(new)

    monkeypatch.setattr(follower_module, "_write_chunk", write)
    for i in range(2, 9):
        before = follower.state_dict["w"].clone()
        commit = run.step(i)
        written.clear()
        monkeypatch.setattr(torch, "nonzero", no_compare)
        try:
            assert follower.update().commit == commit
        finally:
            monkeypatch.setattr(torch, "nonzero", real_nonzero)
        assert same(follower.state_dict, run.repo.load_state_dict(commit))
        changed = int((before.view(torch.int16) != follower.state_dict["w"].view(torch.int16)).sum())
        assert "whole" not in written and sum(written) == changed > 0, (i, written, changed)


@pytest.mark.parametrize("kind", [AdamRun, Run])
def test_a_followers_step_stages_the_changed_elements_not_the_decoded_chunks(tmp_path, kind):
    """Between the fetch and the write, an update holds of each chunk only the elements it
    changes (positions, old and new values), not its decoded bytes: staged whole, a step's
    chunks were a second copy of the model in a following engine (issue 65). Python's own
    allocations (the decoder's bytes) peak well under the model's size over an update, with
    step payloads (whose decoder says what changed: AdamRun) and without (Run)."""
    import tracemalloc

    run = kind(tmp_path / "run", str(tmp_path / "remote"), n=1 << 25)  # 64 MiB: 16 chunks of 4 MiB
    run.step(0)
    follower = wvc.follow(str(tmp_path / "remote"))
    follower.update()
    run.step(1)
    follower.update()
    model_bytes = 2 << 25
    for i in (2, 3):
        commit = run.step(i)
        tracemalloc.start()
        try:
            assert follower.update().commit == commit
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert same(follower.state_dict, run.repo.load_state_dict(commit))
        assert peak < 0.5 * model_bytes, (i, peak / model_bytes)


def test_an_ordinary_reads_chunks_are_compared_with_the_held_bytes_on_the_codec_pool(tmp_path, monkeypatch):
    """Where chunks are decoded one after another (a source that is not thread-safe: here a
    local repository's), each is compared with the held bytes on the codec pool while the
    next decodes, not on the caller's thread after it."""
    import threading

    from wvc.read import follower as follower_module

    run = Run(tmp_path / "run", str(tmp_path / "remote"), n=1 << 20)
    run.step(0)
    follower = wvc.follow(str(tmp_path / "run"))
    follower.update()
    threads, real_of = set(), follower_module._ChunkChanges.of.__func__

    def of(cls, raw, base, region, width):
        threads.add(threading.current_thread().name)
        return real_of(cls, raw, base, region, width)

    monkeypatch.setattr(follower_module._ChunkChanges, "of", classmethod(of))
    commit = run.step(1)
    assert follower.update().commit == commit and same(follower.state_dict, run.repo.load_state_dict(commit))
    assert threads and all(name.startswith("wvc-codec") for name in threads), threads


def test_a_sparse_step_is_applied_from_its_list_of_changes_not_by_comparing_chunks(tmp_path, monkeypatch):
    """A step whose chunks a record gives as SPARSE payloads over the held chunk (no step
    context: scattered changes, Run) is decoded with its changed elements read off the
    payload (codec.decode_sparse_changes), not found by comparing each decoded chunk with
    the held one (a fifth of a 494M RL step's chunks, whose comparison cost more than their
    decode, issue 65); the tensors and the update's patches are exact."""
    from wvc.codec import transforms
    from wvc.codec.container import Method, peek
    from wvc.read import follower as follower_module

    run = Run(tmp_path / "run", str(tmp_path / "remote"), n=1 << 21)  # 4 MiB: a chunk
    first = run.step(0)
    held = {"w": run.w.clone()}
    follower = wvc.follow(str(tmp_path / "remote"), state_dict=held, at=first, patches=True)
    listed, compared, methods = [], [], []
    real_list, real_of = transforms.decode_sparse_changes, follower_module._ChunkChanges.of.__func__

    def listing(payload, raw_size, base, width):
        methods.append(peek(payload).method)
        got = real_list(payload, raw_size, base, width)
        listed.append(got is not None)
        return got

    monkeypatch.setattr(transforms, "decode_sparse_changes", listing)
    monkeypatch.setattr(follower_module._ChunkChanges, "of",
                        classmethod(lambda cls, *a: compared.append(1) or real_of(cls, *a)))
    for i in (1, 2, 3):
        if i == 2:
            forbid_ordinary_reads(monkeypatch)  # (the first update reads the tree at= names)
        before = held["w"].clone()
        commit = run.step(i)
        update = follower.update(commit)
        assert update.commit == commit and same(held, run.repo.load_state_dict(commit))
        changed = torch.nonzero(before.view(torch.int16).reshape(-1) != held["w"].view(torch.int16).reshape(-1))
        assert torch.equal(update.patches["w"], changed.reshape(-1))
    assert Method.SPARSE in methods and any(listed), methods
    assert not compared


def test_a_follower_started_mid_run_from_a_clones_checkout_reads_one_step(tmp_path, monkeypatch):
    """A server started mid-run from ``wvc checkout X`` of a clone holds X; the record of X+1
    is coded in the context of X-1, which only the clone holds. Lent the clone's chunks
    (repository=), its first update reads that step's record alone, about what a follower
    that followed all along reads, not X+1 through its chains (about the model, which is what
    it reads without them: issue 65); every version exact."""
    remote = str(tmp_path / "remote")
    run = AdamRun(tmp_path / "run", remote, n=1 << 20)  # 2 MiB: step payloads from the second step
    commits = [run.step(i) for i in range(4)]
    clone = wvc.clone(remote, tmp_path / "clone")
    along = wvc.follow(remote)
    along.update(commits[2])
    step_bytes = along.update(commits[3]).downloaded_bytes

    held = {"w": clone.load_state_dict(commits[2])["w"].clone()}
    alone = wvc.follow(remote, state_dict={"w": held["w"].clone()}, at=commits[2])
    alone_bytes = alone.update(commits[3]).downloaded_bytes
    assert same(alone.state_dict, run.repo.load_state_dict(commits[3]))

    follower = wvc.follow(remote, state_dict=held, at=commits[2], patches=True, repository=clone.root)
    follower._start_at()  # (reads at='s tree the ordinary way: no chunk)
    forbid_ordinary_reads(monkeypatch)
    first = follower.update(commits[3])
    assert first.commit == commits[3] and same(held, run.repo.load_state_dict(commits[3]))
    assert first.downloaded_bytes <= 1.25 * step_bytes + 4096, (first.downloaded_bytes, step_bytes)
    assert alone_bytes > 2 * first.downloaded_bytes, (alone_bytes, first.downloaded_bytes)
    later = run.step(4)  # (pushed after the clone: the step context is the follower's own now)
    assert follower.update(later).commit == later and same(held, run.repo.load_state_dict(later))


def test_a_lazy_clone_lends_only_the_chunks_it_holds(tmp_path):
    """A clone that does not hold the version before X (a lazy clone made before it) lends
    nothing for it, and its remote is not asked through the clone: the follower reads X+1
    the ordinary way, exact."""
    remote = str(tmp_path / "remote")
    run = AdamRun(tmp_path / "run", remote, n=1 << 20)
    commits = [run.step(0)]
    clone = wvc.clone(remote, tmp_path / "clone", lazy=True)
    commits += [run.step(i) for i in range(1, 4)]
    store = clone.internals.store
    before = store.count_objects()
    context = run.repo.tree_of(commits[1]).files[0].tensors[0].chunks
    assert not any(store.has(c) for c in context)  # (the scenario: X-1's chunks not fetched yet)
    held = {"w": run.repo.load_state_dict(commits[2])["w"].clone()}
    follower = wvc.follow(remote, state_dict=held, at=commits[2], repository=clone.root)
    assert follower.update(commits[3]).commit == commits[3]
    assert same(held, run.repo.load_state_dict(commits[3]))
    assert store.count_objects() == before  # nothing fetched into the clone


def test_a_followers_repository_must_be_a_wvc_repository(tmp_path):
    (tmp_path / "plain").mkdir()
    with pytest.raises(wvc.errors.InvalidArgument, match="holds no wvc repository"):
        wvc.follow(str(tmp_path / "remote"), repository=tmp_path / "plain")


def test_an_engine_started_mid_run_from_a_clone_uses_its_chunks(tmp_path, monkeypatch):
    """A vLLM worker's session (integrations/vllm/session.py) started mid-run from a clone's
    checkout (its --model the clone's working tree) lends the follower the clone's chunks: the
    first update reads one step, and the engine is written exact. A checkout into another
    directory names its clone by WVC_VLLM_REPOSITORY; one that names no repository is an error
    at start."""
    import hashlib

    from wvc.integrations.vllm.session import EngineFollower

    from .shared_follower_worker import ShardEngine

    remote = str(tmp_path / "remote")
    run = AdamRun(tmp_path / "run", remote, n=1 << 20)
    commits = [run.step(i) for i in range(4)]
    along = wvc.follow(remote)
    along.update(commits[2])
    step_bytes = along.update(commits[3]).downloaded_bytes

    def started(model: Path):
        engine = ShardEngine(0, 1, safetensors.torch.load_file(next(model.glob("*.safetensors"))))
        return engine, EngineFollower(lambda names: engine, remote, "main", at=commits[2], model=str(model))

    def digest(commit):
        return {n: hashlib.sha256(t.reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()
                for n, t in run.repo.load_state_dict(commit).items()}

    clone = wvc.clone(remote, tmp_path / "clone")
    clone.checkout(commits[2], force=True)
    clone.checkout(commits[2], output=tmp_path / "elsewhere")
    engine, session = started(tmp_path / "clone")
    real_open = follower_module.open_remote_version
    forbid_ordinary_reads(monkeypatch)
    up = session.update(commits[3])
    assert up.commit == commits[3] and engine.digest() == digest(commits[3])
    assert up.downloaded_bytes <= 1.25 * step_bytes + 4096, (up.downloaded_bytes, step_bytes)

    monkeypatch.setattr(follower_module, "open_remote_version", real_open)  # (at='s tree: read at start)
    monkeypatch.setenv("WVC_VLLM_REPOSITORY", str(tmp_path / "clone"))
    engine, session = started(tmp_path / "elsewhere")
    up = session.update(commits[3])
    assert engine.digest() == digest(commits[3])
    assert up.downloaded_bytes <= 1.25 * step_bytes + 4096, (up.downloaded_bytes, step_bytes)

    monkeypatch.setenv("WVC_VLLM_REPOSITORY", str(tmp_path / "elsewhere"))
    with pytest.raises(wvc.errors.InvalidArgument, match="holds no wvc repository"):
        started(tmp_path / "elsewhere")


def test_a_damaged_clone_costs_a_download_not_wrong_bytes(tmp_path):
    """A clone whose packs were damaged after it was made: what it lends fails its hash check,
    and the follower reads those chunks from the remote instead; the version it reaches is
    exact."""
    remote = str(tmp_path / "remote")
    run = AdamRun(tmp_path / "run", remote, n=1 << 20)
    commits = [run.step(i) for i in range(4)]
    clone = wvc.clone(remote, tmp_path / "clone")
    for pack in (tmp_path / "clone" / ".wvc" / "packs").rglob("*"):
        if pack.is_file() and pack.stat().st_size > 4096:
            data = bytearray(pack.read_bytes())
            for k in range(64, len(data) - 64, 97):
                data[k] ^= 0x5A
            pack.write_bytes(bytes(data))
    held = {"w": run.repo.load_state_dict(commits[2])["w"].clone()}
    follower = wvc.follow(remote, state_dict=held, at=commits[2], repository=clone.root)
    assert follower.update(commits[3]).commit == commits[3]
    assert same(held, run.repo.load_state_dict(commits[3]))


class WalkRun(Run):
    """A Run whose fp32 master takes small random steps published in bf16 (an optimizer's at
    a small learning rate): ten steps' net change is far smaller than their sum, so a prune
    re-encodes the kept versions onto each other (remotes/rebase_plan.py)."""

    def __init__(self, root, url, n=1 << 19):
        super().__init__(root, url, n)
        self.master = torch.randn(n, generator=self.g) * 0.02
        self.w = self.master.to(torch.bfloat16)

    def move(self) -> None:
        self.master.add_(torch.randn(self.master.shape, generator=self.g).clamp_(-3, 3), alpha=-1e-6)
        self.w = self.master.to(torch.bfloat16)


def test_a_follower_keeps_to_step_records_across_a_prune_that_rewrites_their_packs(tmp_path, monkeypatch):
    """A prune here and on the remote every 5 steps (as WvcWeightTransfer's keep= does) rewrites
    the packs the newest step records name payloads in, the kept versions' chunks re-encoded
    onto each other: the records are built again against the new packs, so a follower of the
    branch keeps moving a step at a time by records (it never reads a version the usual way),
    exact; the remote's kept versions exact for a clone."""
    remote = str(tmp_path / "remote")
    run = WalkRun(tmp_path / "run", remote, n=1 << 20)
    policy = {"every": 10, "last": 4}
    first = run.step(0)
    follower = wvc.follow(remote, state_dict={"w": run.w.clone()}, at=first)
    follower._start_at()
    forbid_ordinary_reads(monkeypatch)
    commits, reencoded = [first], 0
    for i in range(1, 31):
        commits.append(run.step(i))
        if i % 5 == 0:
            run.repo.prune("main", keep=policy)
            reencoded += run.repo.remote_prune("origin", "main", keep=policy).chunks_reencoded
            # (a backend that deletes retired packs at once, the Hub, leaves no record naming one
            # usable: the directory remote keeps them readable through the grace period). A kept
            # version's record is built again; a pruned one's cannot be, and stays as it was.
            there = RemoteRepository.open(open_backend(remote))
            live = {seg.pack for seg in there.contents.live_segments}
            named = {c.pack for commit in there.step_records() if commit not in there.pruned
                     for c in step_records.fetch(there.backend, commit).chunks if c.pack is not None}
            assert named <= live, i
        if i % 3 == 0:  # (a follower a few steps behind: it reads the records of several steps)
            assert follower.update().commit == commits[-1]
            assert torch.equal(follower.state_dict["w"].view(torch.int16), run.w.view(torch.int16)), i
    assert reencoded > 0
    monkeypatch.undo()
    clone = wvc.clone(remote, tmp_path / "clone")
    assert clone.fsck().errors == []
    for c in set(commits[::10]) | set(commits[-4:]):
        assert same(clone.load_state_dict(c), run.repo.load_state_dict(c))
