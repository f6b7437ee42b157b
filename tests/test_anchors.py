"""The anchor policy (store/anchors.py): a hierarchy of anchors on each chunk's line, so that
what a run stores a step stops growing with the run, within the same chain depth."""

import pytest
import torch

from wvc import Repo
from wvc.store import anchors
from wvc.store.rows import ObjectRow

from benchmarks import retired_anchor_policies as retired

from .test_step_codec import adam_like_steps, bf16_state, needs_c


def test_the_span_is_the_largest_power_of_the_fanout_dividing_the_position():
    assert anchors.ANCHOR_SPACING == 4
    assert [anchors.span(s) for s in (1, 2, 3, 4, 5, 8, 12, 16, 32, 48, 64, 80, 192, 256)] == \
        [1, 1, 1, 4, 1, 4, 4, 16, 16, 16, 64, 16, 64, 256]


def row(oid, depth):
    return ObjectRow(oid, "p", 0, 10 if depth else 1000, 1000, 7, None, depth)


def line(positions):
    """A chain as the policy builds it: the versions at ``positions`` (top first), the last a root."""
    chain = [row(f"v{p}", len(positions) - 1 - k) for k, p in enumerate(positions)]
    return chain, {f"v{p}": p for p in positions if p}


def test_the_base_is_on_the_parents_chain_at_the_position_one_span_back():
    chain, pos = line([6, 5, 4, 0])  # the chain of 6: 6 -> 5 -> 4 -> 0
    base, position = anchors.choose_base(chain, pos, max_chain=8)
    assert position == 7 and [r.id for r in base] == ["v6", "v5", "v4", "v0"]  # a step on 6
    chain, pos = line([7, 6, 5, 4, 0])
    base, position = anchors.choose_base(chain, pos, max_chain=8)
    assert position == 8 and [r.id for r in base] == ["v4", "v0"]  # 8 on 4
    chain, pos = line([15, 14, 13, 12, 8, 4, 0])
    base, position = anchors.choose_base(chain, pos, max_chain=8)
    assert position == 16 and [r.id for r in base] == ["v0"]  # 16 on 0


def test_a_root_without_a_position_starts_a_line():
    chain = [row("fetched", 3), row("b", 2), row("c", 1), row("k", 0)]
    base, position = anchors.choose_base(chain, {}, max_chain=8)
    assert position == 1 and base[0].id == "fetched"
    chain2 = [row("x1", 4)] + chain
    base, position = anchors.choose_base(chain2, {"x1": 1, "x2": 2}, max_chain=8)
    assert position == 2 and base[0].id == "x1"
    chain3 = [row("x3", 6), row("x2", 5)] + chain2
    base, position = anchors.choose_base(chain3, {"x1": 1, "x2": 2, "x3": 3}, max_chain=8)
    assert position == 4 and base[0].id == "fetched"  # the root is position 0


def test_a_full_chain_jumps_ahead_to_an_anchor_and_heavy_deltas_fall_back_to_the_keyframe():
    chain, pos = line([6, 5, 4, 0])
    base, position = anchors.choose_base(chain, pos, max_chain=3)  # 6 is 3 deep already
    assert position == 8 and [r.id for r in base] == ["v4", "v0"]  # 7 jumps to 8, an anchor on 4
    chain, pos = line([11, 10, 9, 8, 4, 0])  # 12's target, 8, is 2 deep: too deep for 2
    base, position = anchors.choose_base(chain, pos, max_chain=2)
    assert position == 16 and [r.id for r in base] == ["v0"]  # 16 on 0, the next level
    # the policy before the jump took the first link further down and counted on
    assert [r.id for r in retired.choose_base_nearest(chain, pos, max_chain=2)[0]] == ["v4", "v0"]
    fetched = [ObjectRow("f", "p", 0, 10, 1000, 7, None, 5), row("k", 0)]  # a root 5 deep: full
    base, position = anchors.choose_base(fetched, {}, max_chain=3)
    assert position == 0 and [r.id for r in base] == ["k"]
    chain, pos = line([6, 5, 4, 0])
    heavy = [ObjectRow(r.id, "p", 0, 400 if r.depth else 1000, 1000, 7, None, r.depth) for r in chain]
    base, position = anchors.choose_base(heavy, pos, max_chain=8)  # 1200 of deltas over a 1000 keyframe
    assert position == 0 and [r.id for r in base] == ["v0"]


def _line_of(policy, versions: int, max_chain: int = 8):
    """The bases ``policy`` picks for a chunk's versions 1..``versions`` (payloads all small):
    each version's span back to its base, and its depth."""
    root = row("v0", 0)
    chain, positions, spans, depths = [root], {}, [], []
    for s in range(1, versions + 1):
        base, position = policy(chain, positions, max_chain)
        new = ObjectRow(f"v{s}", "p", 0, 10, 1000, 7, base[0].id, base[0].depth + 1)
        if position:
            positions[new.id] = position
        spans.append(s - int(base[0].id[1:]))
        depths.append(new.depth)
        chain = [new] + base
    return spans, depths


def test_most_versions_of_a_long_run_stay_step_deltas_within_max_chain():
    """A position's depth is its digit sum in base 4, past 8 for most positions after a few
    hundred steps. Taking the first link below a full target kept the positions counting:
    72% of 5,000 versions were deltas over a span (17.6 steps on average). Jumping ahead to
    a new anchor leaves the versions after it step deltas again."""
    spans, depths = _line_of(anchors.choose_base, 5000)
    assert max(depths) <= 8
    assert sum(1 for s in spans if s == 1) >= 0.55 * len(spans)
    assert sum(spans) / len(spans) < 8
    before, _ = _line_of(retired.choose_base_nearest, 5000)
    assert sum(1 for s in before if s == 1) < 0.3 * len(before)  # (what the jump changes)


def chunk_of(repo, commit):
    return next(t for t in repo.tree_of(commit).files[0].tensors if t.name == "w").chunks[0]


@needs_c
def test_a_run_stores_the_hierarchy_and_every_version_checks_out_exactly(tmp_path):
    versions = adam_like_steps(22)
    repo = Repo.init(tmp_path / "r")
    commits = [repo.commit(f"step {i}", source=bf16_state(v)).commit for i, v in enumerate(versions)]
    chunks = [chunk_of(repo, c) for c in commits]
    for s in range(1, len(commits)):
        r = repo.internals.store.row(chunks[s])
        assert r.base == chunks[s - anchors.span(s)], s
        assert r.depth <= repo.max_chain
    # depth is the sum of the position's base-4 digits: 21 = 111 -> 3, 16 = 100 -> 1, 15 = 33 -> 6
    assert [repo.internals.store.row(chunks[s]).depth for s in (21, 16, 15)] == [3, 1, 6]
    assert set(repo.internals.store.anchor_positions(chunks)) == set(chunks[1:])
    # a push's step records read a chunk, its parent's and the grandparent's: one chain decoded
    known: dict = {}
    for s in (19, 18, 20):
        assert repo.internals.store.get_from(chunks[s], known) == repo.internals.store.get(chunks[s])
    assert {chunks[s] for s in (20, 19, 18, 17, 16, 0)} <= set(known)  # 19 -> 18 -> 17 -> 16 -> 0; 20 on 16
    reopened = Repo.open(tmp_path / "r")
    for commit, v in zip(commits, versions):
        got = reopened.load_state_dict(commit)["w"]
        assert got.view(torch.int16).numpy().tobytes() == v


@needs_c
def test_a_long_run_stores_less_than_re_anchoring_to_the_keyframe(tmp_path, monkeypatch):
    """The re-anchored step stored the drift since the keyframe, growing with the run; an
    anchor stores the drift over its own span. Same chain bound (8) both ways."""
    versions = adam_like_steps(160, n=1 << 14)

    def stored(root):
        repo = Repo.init(root)
        for i, v in enumerate(versions):
            repo.commit(f"step {i}", source={"w": bf16_state(v)["w"]})
        total = sum(e.stored_bytes for e in repo.log()[:-1])  # every step, the first keyframe aside
        depth = max(r.depth for r in repo.internals.store.rows(repo.internals.store.object_ids()).values())
        return total, depth

    hierarchy, depth = stored(tmp_path / "hierarchy")
    monkeypatch.setattr(anchors, "choose_base", retired.choose_base_flat)  # re-anchored at the bound
    flat, flat_depth = stored(tmp_path / "flat")
    assert depth <= 8 and flat_depth == 8
    # (0.73, 0.69 and 0.66 of it over 80, 160 and 320 steps here: these steps move the same
    # elements each time, so the drift since the keyframe grows only in magnitude; the
    # calibrated run of benchmarks/long_run.py, whose moving elements change, gains more)
    assert hierarchy < 0.75 * flat, (hierarchy, flat)


def test_gc_and_prune_leave_no_position_behind(tmp_path):
    repo = Repo.init(tmp_path / "r")
    g = torch.Generator().manual_seed(0)
    w = torch.randn(1 << 14, generator=g).to(torch.bfloat16)
    for i in range(12):
        w[i::50] += 1e-2
        repo.commit(f"step {i}", source={"w": w.clone()}, metadata={"step": i})
    assert repo.internals.store.anchor_positions(repo.internals.store.object_ids())
    repo.prune("main", keep={"every": 5, "last": 1})
    repo.gc(grace_seconds=0)
    positions = repo.internals.db.query("SELECT id FROM anchor_positions")
    assert {o for (o,) in positions} <= set(repo.internals.store.object_ids())
    assert repo.fsck().errors == []


def test_a_long_lived_writer_keeps_only_anchors_as_inner_links_and_decodes_no_chain(tmp_path, monkeypatch):
    """A writer that keeps recent chunks (the Publisher, the TRL transfer) holds, besides the
    last two commits' chunks, only the inner links a later version can be encoded against or
    in the context of: anchors (positions that are multiples of ANCHOR_SPACING). It also kept
    the step versions between anchors, never read again: three copies of the model of every
    four it held (a 74M trainer's staging kept 0.9 GB of them, issue 65). Every commit still
    finds its base and context in memory: no chain is decoded."""
    import wvc.store.chunks as chunks_module

    repo = Repo.init(tmp_path / "r")
    store = repo.internals.store
    store.keep_recent(1 << 30)
    g = torch.Generator().manual_seed(0)
    w = torch.randn(1 << 18, generator=g).to(torch.bfloat16)
    model_bytes = w.numel() * 2
    decoded, real = [0], chunks_module.decode_links

    def counting(links, *args, **kwargs):
        decoded[0] += len(links)
        return real(links, *args, **kwargs)

    monkeypatch.setattr(chunks_module, "decode_links", counting)
    for step in range(21):
        idx = torch.randint(0, w.numel(), (w.numel() // 40,), generator=g)
        w[idx] += torch.randn(idx.numel(), generator=g).to(torch.bfloat16) * 1e-2
        repo.commit(f"step {step}", source={"w": w.clone()}, branch="run")  # (not HEAD's: no working tree written)
        positions = store.anchor_positions(list(store.anchor_chunks))
        assert all(positions.get(oid, 0) % anchors.ANCHOR_SPACING == 0 for oid in store.anchor_chunks), (step, positions)
        # the root and at most three anchors a level below the top one in use (4, 8, 12, then
        # 16 and its own): never the steps between
        assert store.anchor_bytes <= 4 * model_bytes, (step, store.anchor_bytes / model_bytes)
    assert decoded[0] == 0
