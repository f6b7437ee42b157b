"""A model of many small tensors (LayerNorms, biases, attention projections) costs no fixed
work per chunk beyond what its bytes need: delta bases and chains are looked up in a few
queries, not one or more per chunk, and the pack is written without a system call per
object. These count work instead of timing it (the times are in benchmarks/speed.py)."""

import os

import pytest
import torch
from safetensors.torch import save_file

from wvc import Repo, ids

TENSORS = 300


def many_tensor_model(path, steps: int = 0):
    """Small tensors (a weight, a bias and a norm per layer), after ``steps`` optimizer-like steps."""
    g = torch.Generator().manual_seed(0)
    weights = {f"layer.{i}.{kind}": torch.randn(shape, generator=g) * 0.02
               for i in range(TENSORS // 3) for kind, shape in (("weight", (64, 64)), ("bias", (64,)), ("norm", (64,)))}
    for step in range(1, steps + 1):
        g = torch.Generator().manual_seed(step)
        weights = {k: v + 2e-4 * torch.randn(v.shape, generator=g) for k, v in weights.items()}
    path.mkdir(parents=True, exist_ok=True)
    save_file({k: v.to(torch.bfloat16) for k, v in weights.items()}, str(path / "model.safetensors"))


class Queries:
    """Counts the SQL statements a repository's connection runs (with their values filled in)."""

    def __init__(self, repo):
        self.statements: list[str] = []
        repo.internals.db.conn.set_trace_callback(self.statements.append)

    def row_lookups(self) -> int:
        """Statements that read object rows by id: one id each, or a batch."""
        return sum(s.startswith("SELECT id, pack, offset") for s in self.statements)

    def batched(self) -> int:
        return sum(s.startswith("SELECT id, pack, offset") and " IN (" in s for s in self.statements)


@pytest.fixture
def two_versions(tmp_path):
    root = tmp_path / "model"
    many_tensor_model(root)
    repo = Repo.init(root)
    repo.commit("base")
    many_tensor_model(root, steps=1)
    yield repo, root
    repo.close()


def test_a_commit_looks_up_its_delta_bases_in_a_few_queries(two_versions):
    """Before: a lookup of the parent chunk's row, then of its chain, at every chunk (two or
    more statements per chunk on top of the new chunk's own existence check)."""
    repo, root = two_versions
    queries = Queries(repo)
    result = repo.commit("step")
    assert result.stored_bytes < 0.8 * (root / "model.safetensors").stat().st_size  # deltas were taken
    assert queries.batched() >= 1
    assert queries.row_lookups() <= 5, queries.row_lookups()
    # the new chunks' existence checks (dedup against all history) are batched too: they were
    # one per chunk, each on the reading thread, waiting for the GIL back from a worker; so is
    # the check that no chunk vanished before the commit lands
    selects = sum(q.startswith("SELECT") for q in queries.statements)
    assert selects < TENSORS // 8, selects


def test_a_commit_still_skips_the_chunks_the_store_holds(two_versions):
    """The batched existence check still deduplicates: a second file with the same tensors
    stores nothing new for them, and a commit of unchanged content stores no payload."""
    repo, root = two_versions
    repo.commit("step")
    (root / "copy.safetensors").write_bytes((root / "model.safetensors").read_bytes())
    assert repo.commit("a copy").stored_bytes < 4096  # (its tree, and the header chunk at most)
    assert repo.commit("nothing new", allow_empty=True).stored_bytes == 0


def test_small_chunks_are_coded_many_to_a_pool_task(two_versions, tmp_path, monkeypatch):
    """A commit and a checkout of 300 small tensors hand the pool a task per ~32 of them, not
    one each (a hand-off each cost more CPU than coding the chunk); the bytes are the same."""
    from wvc.codec import pool as codec_pool

    repo, root = two_versions
    submitted = []
    real_pool = codec_pool.pool()

    class Counting:
        def submit(self, fn, *args):
            submitted.append(fn)
            return real_pool.submit(fn, *args)

        def map(self, *args):
            return real_pool.map(*args)

    monkeypatch.setattr(codec_pool, "pool", lambda: Counting())
    head = repo.commit("step").commit
    assert 0 < len(submitted) <= TENSORS // 16, len(submitted)
    submitted.clear()
    repo.checkout(head, output=tmp_path / "out", force=True)
    assert (tmp_path / "out" / "model.safetensors").read_bytes() == (root / "model.safetensors").read_bytes()
    assert 0 < len(submitted) <= TENSORS // 16, len(submitted)


def test_a_checkout_resolves_every_chain_in_a_few_queries(two_versions, tmp_path):
    """Before: one or more statements per chunk (each delta and its keyframe), on the thread
    that also writes the file."""
    repo, root = two_versions
    head = repo.commit("step").commit
    expected = (root / "model.safetensors").read_bytes()
    queries = Queries(repo)
    repo.checkout(head, output=tmp_path / "out", force=True)
    assert (tmp_path / "out" / "model.safetensors").read_bytes() == expected
    assert queries.row_lookups() <= 5, queries.row_lookups()


def test_chains_of_every_depth_resolve_from_the_batched_rows(tmp_path):
    """Chains several links deep (max_chain 8): the batched lookup walks them level by level and
    every version checks out exactly."""
    root = tmp_path / "model"
    repo = Repo.init(root)
    saved = []
    for step in range(6):
        many_tensor_model(root, steps=step)
        saved.append((repo.commit(f"step {step}").commit, (root / "model.safetensors").read_bytes()))
    assert repo.internals.db.one("SELECT MAX(depth) FROM objects") >= 3
    for k, (commit, data) in enumerate(saved):
        out = tmp_path / f"out{k}"
        queries = Queries(repo)
        repo.checkout(commit, output=out, force=True)
        assert (out / "model.safetensors").read_bytes() == data
        assert queries.row_lookups() <= 12, queries.row_lookups()
    repo.close()


def test_pack_offsets_need_no_system_call_per_object(two_versions, monkeypatch, tmp_path):
    """The pack writer counts its own offset (it asked the file, tell(): a system call per
    object), and the objects are where its index says (every version reads back exactly)."""
    repo, root = two_versions
    from wvc.store import packs

    tells = []

    class CountingFile:
        def __init__(self, fh):
            self.fh = fh

        def tell(self):
            tells.append(1)
            return self.fh.tell()

        def __getattr__(self, name):
            return getattr(self.fh, name)

    real_init, real_add = packs.PackWriter.__init__, packs.PackWriter.add
    adds = []

    def init(self, directory):
        real_init(self, directory)
        self.fh = CountingFile(self.fh)

    def add(self, *a, **k):
        before = len(tells)
        entry = real_add(self, *a, **k)
        adds.append(len(tells) - before)
        return entry

    monkeypatch.setattr(packs.PackWriter, "__init__", init)
    monkeypatch.setattr(packs.PackWriter, "add", add)
    result = repo.commit("step")
    assert len(adds) >= TENSORS and sum(adds) == 0
    data = (root / "model.safetensors").read_bytes()
    repo.checkout(result.commit, output=tmp_path / "out", force=True)
    assert (tmp_path / "out" / "model.safetensors").read_bytes() == data


def test_the_codec_pool_size_can_be_set_for_machines_with_more_cores(monkeypatch):
    """One thread per core up to 4 by default; WVC_CODEC_THREADS (1-64) sets it, so that a
    16-core machine can be measured with 16; nonsense falls back to the default."""
    from wvc.codec import pool as codec_pool

    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    monkeypatch.delenv("WVC_CODEC_THREADS", raising=False)
    assert codec_pool._codec_threads() == 4
    monkeypatch.setenv("WVC_CODEC_THREADS", "16")
    assert codec_pool._codec_threads() == 16
    for bad in ("0", "65", "many", "-3"):
        monkeypatch.setenv("WVC_CODEC_THREADS", bad)
        assert codec_pool._codec_threads() == 4


def test_the_codec_pool_fits_the_cpus_the_process_may_use(monkeypatch):
    """A process pinned to fewer CPUs than the machine has (taskset, a container's cpuset, a
    launcher pinning each rank) gets a pool of that many threads, not of the machine's: a
    2-CPU pod on a 64-core host ran 4 codec threads on 2 CPUs. Where affinity is unknown,
    the machine's count."""
    from wvc.codec import pool as codec_pool

    monkeypatch.delenv("WVC_CODEC_THREADS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {5, 9}, raising=False)
    assert codec_pool._codec_threads() == 2
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3}, raising=False)
    assert codec_pool._codec_threads() == 1

    def unknown(pid):
        raise OSError("no affinity here")

    monkeypatch.setattr(os, "sched_getaffinity", unknown, raising=False)
    assert codec_pool._codec_threads() == 4
    monkeypatch.setattr(os, "cpu_count", lambda: 3)
    assert codec_pool._codec_threads() == 3


def test_chunks_come_out_in_order_across_row_batches(two_versions, monkeypatch):
    """get_many looks rows up a batch at a time as it hands chunks out (the pool starts on
    the first FIRST_ROWS while the rest are looked up): every chunk in the order asked, a
    chunk asked twice, in two batches, given twice."""
    from wvc.store import chunks
    from wvc.codec import pool

    repo, _ = two_versions
    head = repo.commit("step").commit
    chunk_ids = [c for e in repo.tree_of(head).files for t in (e.tensors or []) for c in t.chunks]
    assert len(chunk_ids) > 40
    asked = chunk_ids[:30] + chunk_ids[5:12] + chunk_ids[::-1]
    monkeypatch.setattr(chunks, "FIRST_ROWS", 3)
    monkeypatch.setattr(chunks, "ROW_BATCH", 7)
    monkeypatch.setattr(pool, "SMALL_CHUNK", 0)  # (a pool task a chunk: the first goes out at once)
    queries = Queries(repo)
    at_first_decode = []
    real_submit = pool.pool().submit

    def submit(*args):
        at_first_decode.append(queries.row_lookups())
        return real_submit(*args)

    monkeypatch.setattr(pool.pool(), "submit", submit)
    got = list(repo.internals.store.get_many(asked))
    assert [ids.chunk_id(b) for b in got] == asked
    # the first decode went to the pool after the first batch's lookups (its ids, their
    # bases), not after all of them (before: every row was looked up first)
    assert at_first_decode[0] <= 2 < queries.row_lookups(), (at_first_decode[0], queries.row_lookups())


def test_a_stored_header_that_disagrees_with_its_tree_is_refused(two_versions, tmp_path):
    """The header is checked once the first chunk is out (the pool decodes meanwhile), still
    before the file is renamed into place: a tree whose tensors the stored header does not
    declare writes nothing."""
    import dataclasses

    from wvc.errors import CorruptObject
    from wvc.worktree.materialize import write_file

    repo, root = two_versions
    entry = next(e for e in repo.tree_of(repo.log()[0].id).files if e.tensors)
    first = dataclasses.replace(entry.tensors[0], name="not.in.the.header")
    forged = dataclasses.replace(entry, tensors=(first, *entry.tensors[1:]))
    target = tmp_path / "out" / "model.safetensors"
    with pytest.raises(CorruptObject, match="disagree"):
        write_file(repo.internals.store, forged, target)
    assert not target.exists() and list(target.parent.iterdir()) == []
    write_file(repo.internals.store, entry, target)  # (the true entry: written, byte-identical)
    many_tensor_model(tmp_path / "base")
    assert target.read_bytes() == (tmp_path / "base" / "model.safetensors").read_bytes()


def _meeting_decodes(store, monkeypatch) -> list:
    """Make ``store``'s first two chunk decodes wait for each other at a barrier (they must
    be in flight together; one at a time, the first waits alone and the barrier breaks).
    -> the list their barrier indexes go into."""
    import itertools
    import threading

    real, barrier = store.decode_chain, threading.Barrier(2, timeout=20)
    met, calls = [], itertools.count()

    def decode_chain(chain):
        if next(calls) < 2:  # the first two decodes meet
            met.append(barrier.wait())
        return real(chain)

    monkeypatch.setattr(store, "decode_chain", decode_chain)
    return met


@pytest.fixture
def one_chunk_tensors(tmp_path):
    from wvc.codec import pool as codec_pool

    if codec_pool.WORKERS < 2:
        pytest.skip("the codec pool has one worker here")
    g = torch.Generator().manual_seed(0)
    state = {f"w{i}": torch.randn(256, 256, generator=g) for i in range(4)}  # 256 KiB each: a pool task each
    with Repo.init(tmp_path / "r") as repo:
        yield repo, repo.commit("v", source=state).commit, state


def test_loading_a_version_decodes_chunks_of_different_tensors_at_once(one_chunk_tensors, monkeypatch):
    """``load_state_dict`` hands the codec pool every tensor's chunks ahead, not one tensor at
    a time (before, a model of one-chunk tensors decoded on one core)."""
    repo, commit, state = one_chunk_tensors
    met = _meeting_decodes(repo.internals.store, monkeypatch)
    got = repo.load_state_dict(commit)
    assert sorted(met) == [0, 1]
    assert all(torch.equal(got[k].view(torch.int32), state[k].view(torch.int32)) for k in state)


def test_exporting_a_version_decodes_chunks_of_different_tensors_at_once(one_chunk_tensors, monkeypatch, tmp_path):
    """``export`` reads a shard's whole tensors through one stream of decodes, as load does."""
    from safetensors.torch import load_file

    repo, commit, state = one_chunk_tensors
    met = _meeting_decodes(repo.internals.store, monkeypatch)
    repo.export(commit, tmp_path / "out")
    assert sorted(met) == [0, 1]
    got = {}
    for f in sorted((tmp_path / "out").glob("*.safetensors")):
        got.update(load_file(str(f)))
    assert set(got) == set(state)
    assert all(torch.equal(got[k].view(torch.int32), state[k].view(torch.int32)) for k in state)


def test_merging_decodes_the_sides_of_a_computed_tensor_at_once(one_chunk_tensors, monkeypatch):
    """A strategy merge reads the base, ours and theirs of its computed tensors through one
    stream of decodes, as load does (before, a tensor's each side was read alone)."""
    repo, base, state = one_chunk_tensors
    g = torch.Generator().manual_seed(1)
    repo.create_branch("exp")
    repo.commit("ours", source={**state, "w0": state["w0"] + 0.01 * torch.randn(256, 256, generator=g)})
    theirs = {**state, "w0": state["w0"] - 0.01 * torch.randn(256, 256, generator=g)}
    repo.commit("theirs", source=theirs, branch="exp")
    ours = repo.load_state_dict("HEAD")
    met = _meeting_decodes(repo.internals.store, monkeypatch)
    res = repo.merge("exp", strategy="linear")
    assert res.computed == ["model.safetensors:w0"], res.computed
    assert sorted(met) == [0, 1]
    merged = repo.load_state_dict("HEAD")["w0"]
    assert torch.equal(merged, (0.5 * ours["w0"].float() + 0.5 * theirs["w0"].float()).to(merged.dtype))
