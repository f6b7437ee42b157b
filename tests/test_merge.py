"""Merge (docs/merge.md): three-way, per tensor and per chunk, exact where it can be, with
the merge methods people use, each equal bit for bit to mergekit's own implementation."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from wvc import Repo, clone
from wvc.errors import UncommittedChanges, WvcError
from wvc.ops.merge import MergeConflict

from .conftest import repo_state, sha256, tree_digests

SHAPE = (64, 96)


def weights(seed: int, names=("a", "b", "c")) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {n: (torch.randn(SHAPE, generator=g) * 0.02).to(torch.bfloat16) for n in names}


def nudge(t: torch.Tensor, seed: int, scale: float = 1e-3) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (t.float() + torch.randn(t.shape, generator=g) * scale).to(t.dtype)


def save(repo: Repo, sd: dict, msg: str, config: dict | None = None) -> str:
    save_file(sd, str(repo.root / "model.safetensors"))
    (repo.root / "config.json").write_text(json.dumps(config or {"hidden": 96}))
    return repo.commit(msg).commit


@pytest.fixture
def forked(tmp_path):
    """main and `exp` forked from one base commit; each side's state dict is returned."""
    repo = Repo.init(tmp_path / "m")
    base = weights(0)
    save(repo, base, "base")
    repo.create_branch("exp")
    return repo, base


def test_disjoint_tensor_changes_merge_exactly_with_no_strategy(forked, tmp_path):
    repo, base = forked
    ours = {**base, "a": nudge(base["a"], 1)}
    save(repo, ours, "train a")
    repo.checkout("exp")
    theirs = {**base, "c": nudge(base["c"], 2)}
    save(repo, theirs, "train c", config={"hidden": 96, "note": "theirs"})
    repo.checkout("main")
    res = repo.merge("exp")
    assert res.status == "merged" and res.computed == [] and len(repo.read_commit(res.commit).parents) == 2
    expected = tmp_path / "expected.safetensors"
    save_file({**base, "a": ours["a"], "c": theirs["c"]}, str(expected))
    assert sha256(repo.root / "model.safetensors") == sha256(expected)
    assert json.loads((repo.root / "config.json").read_text())["note"] == "theirs"  # a file only they changed
    assert repo.status().clean
    out = tmp_path / "out"
    repo.checkout(res.commit, output=out)
    assert sha256(out / "model.safetensors") == sha256(expected)


def test_changes_to_different_chunks_of_one_tensor_merge_per_chunk(tmp_path):
    repo = Repo.init(tmp_path / "m", chunk_bytes=1024)  # each 64x96 bf16 tensor is 12 chunks
    base = weights(0)
    save(repo, base, "base")
    repo.create_branch("exp")
    a_ours, a_theirs = base["a"].clone(), base["a"].clone()
    a_ours[:5] = nudge(base["a"][:5], 1)  # the first chunk only
    a_theirs[-5:] = nudge(base["a"][-5:], 2)  # the last chunk only
    save(repo, {**base, "a": a_ours}, "ours")
    repo.checkout("exp")
    save(repo, {**base, "a": a_theirs}, "theirs")
    repo.checkout("main")
    repo.merge("exp")
    expected = base["a"].clone()
    expected[:5], expected[-5:] = a_ours[:5], a_theirs[-5:]
    assert torch.equal(load_file(str(repo.root / "model.safetensors"))["a"].view(torch.int16), expected.view(torch.int16))


def _conflicting(forked):
    repo, base = forked
    ours = {**base, "a": nudge(base["a"], 1), "b": nudge(base["b"], 3)}
    save(repo, ours, "ours")
    repo.checkout("exp")
    theirs = {**base, "a": nudge(base["a"], 2), "c": nudge(base["c"], 4)}
    save(repo, theirs, "theirs")
    repo.checkout("main")
    return repo, base, ours, theirs


def test_a_conflict_refuses_the_merge_and_changes_nothing(forked, cli):
    repo, base, ours, theirs = _conflicting(forked)
    before = repo_state(repo.root)
    with pytest.raises(MergeConflict) as info:
        repo.merge("exp")
    assert info.value.conflicts == ["model.safetensors:a"]
    assert repo_state(repo.root) == before
    r = cli(repo.root, "merge", "exp", "--json")
    assert r.exit_code == 1 and '"conflicts"' in r.output and "model.safetensors:a" in r.output
    assert repo_state(repo.root) == before


MERGEKIT = {  # our strategy -> (mergekit method, its inputs, base index, its parameters)
    "linear": ("linear", ("ours", "theirs"), None, {"weight": [0.7, 0.3]}),
    "task-arithmetic": ("task_arithmetic", ("base", "ours", "theirs"), 0, {"weight": [0.7, 0.3], "lambda": 0.8}),
    "ties": ("ties", ("base", "ours", "theirs"), 0, {"weight": [0.7, 0.3], "density": 0.6, "lambda": 0.8}),
    "dare-linear": ("dare_linear", ("base", "ours", "theirs"), 0, {"weight": [0.7, 0.3], "density": 0.6, "lambda": 0.8}),
    "dare-ties": ("dare_ties", ("base", "ours", "theirs"), 0, {"weight": [0.7, 0.3], "density": 0.6, "lambda": 0.8}),
    "slerp": ("slerp", ("ours", "theirs"), 0, {"t": 0.3}),
}


@pytest.mark.parametrize("strategy", sorted(MERGEKIT))
def test_each_strategy_equals_mergekit_bit_for_bit(forked, strategy):
    from mergekit.merge_methods.api import merge_tensors

    from wvc.model.merge_methods import tensor_seed

    repo, base, ours, theirs = _conflicting(forked)
    res = repo.merge("exp", strategy=strategy, weights=(0.7, 0.3), density=0.6, lam=0.8, seed=11, t=0.3)
    assert res.computed == ["model.safetensors:a"]
    method, inputs, base_index, params = MERGEKIT[strategy]
    sides = {"base": base["a"], "ours": ours["a"], "theirs": theirs["a"]}
    torch.manual_seed(tensor_seed(11, "a"))  # mergekit draws dare's drop from the global generator
    expected = merge_tensors([sides[k].float() for k in inputs], method, parameters=params, base_index=base_index,
                             dtype=torch.float32, out_dtype=torch.bfloat16)
    merged = load_file(str(repo.root / "model.safetensors"))
    assert torch.equal(merged["a"].view(torch.int16), expected.view(torch.int16))
    assert torch.equal(merged["b"].view(torch.int16), ours["b"].view(torch.int16))  # clean changes stay exact
    assert torch.equal(merged["c"].view(torch.int16), theirs["c"].view(torch.int16))
    recipe = repo.show()["metadata"]["merge"]
    assert recipe["strategy"] == strategy and recipe["computed"] == ["model.safetensors:a"]
    assert recipe["merge_base"] == repo.log()[-1].id


@pytest.mark.parametrize("strategy", ["ours", "theirs"])
def test_ours_and_theirs_take_a_side_bit_for_bit(forked, strategy):
    repo, base, ours, theirs = _conflicting(forked)
    repo.merge("exp", strategy=strategy)
    merged = load_file(str(repo.root / "model.safetensors"))
    side = ours if strategy == "ours" else theirs
    assert torch.equal(merged["a"].view(torch.int16), side["a"].view(torch.int16))


def test_shape_or_dtype_changes_on_both_sides_are_settled_only_by_taking_a_side(forked):
    repo, base = forked
    save(repo, {**base, "a": torch.zeros(4, 4, dtype=torch.bfloat16)}, "ours reshaped a")
    repo.checkout("exp")
    save(repo, {**base, "a": nudge(base["a"], 2).float()}, "theirs made a fp32")
    repo.checkout("main")
    for strategy in (None, "linear", "ties"):
        with pytest.raises(MergeConflict, match="shapes or dtypes differ"):
            repo.merge("exp", strategy=strategy)
    repo.merge("exp", strategy="theirs")
    assert load_file(str(repo.root / "model.safetensors"))["a"].dtype == torch.float32


def test_merging_itself_an_ancestor_or_a_descendant(forked):
    repo, base = forked
    first = repo.head()
    assert repo.merge("main").status == "up-to-date"
    save(repo, {**base, "a": nudge(base["a"], 1)}, "ahead")
    assert repo.merge("exp").status == "up-to-date"  # exp is an ancestor of main
    repo.checkout("exp")
    res = repo.merge("main")
    assert res.status == "fast-forward" and repo.head() == repo.branches()["main"] != first
    assert repo.head_branch() == "exp" and repo.status().clean


def test_a_criss_cross_history_picks_one_merge_base_and_says_so(tmp_path):
    repo = Repo.init(tmp_path / "m")
    base = weights(0)
    save(repo, base, "root")
    repo.create_branch("x")
    save(repo, {**base, "a": nudge(base["a"], 1)}, "main: a")
    repo.checkout("x")
    save(repo, {**base, "b": nudge(base["b"], 2)}, "x: b")
    x1 = repo.head()
    repo.checkout("main")
    m1 = repo.head()
    repo.merge("x")  # main = M(m1, x1)
    repo.checkout("x")
    repo.create_branch("y", x1)
    repo.checkout("y")
    repo.merge(m1)  # y = M(x1, m1): m1 and x1 are now both best common ancestors of main and y
    save(repo, {**load_file(str(repo.root / "model.safetensors")), "c": nudge(base["c"], 3)}, "y: c")
    repo.checkout("main")
    res = repo.merge("y")
    assert set(res.merge_bases) == {m1, x1} and res.merge_base == res.merge_bases[0]
    merged = load_file(str(repo.root / "model.safetensors"))
    assert torch.equal(merged["c"].view(torch.int16), nudge(base["c"], 3).view(torch.int16))


def test_no_commit_writes_the_result_and_the_next_commit_is_the_merge(forked):
    repo, base, ours, theirs = _conflicting(forked)
    head = repo.head()
    res = repo.merge("exp", strategy="linear", no_commit=True)
    assert res.status == "written" and repo.head() == head
    assert not repo.status().clean
    done = repo.commit("merge by hand")
    assert repo.read_commit(done.commit).parents == (head, repo.branches()["exp"])
    assert repo.show()["metadata"]["merge"]["strategy"] == "linear"


def test_a_merge_needs_a_clean_working_tree(forked):
    repo, base, ours, theirs = _conflicting(forked)
    (repo.root / "config.json").write_text("{}")
    with pytest.raises(UncommittedChanges):
        repo.merge("exp", strategy="ours")


def test_a_merge_commit_travels_and_survives_gc_and_fsck(forked, tmp_path, cli):
    repo, base, ours, theirs = _conflicting(forked)
    res = repo.merge("exp", strategy="ties", density=0.5)
    repo.remote_add("origin", str(tmp_path / "remote"))
    repo.push()
    for lazy in (False, True):
        copy = clone(str(tmp_path / "remote"), tmp_path / f"copy-{lazy}", lazy=lazy)
        assert tree_digests(copy.root) == tree_digests(repo.root)
        assert copy.read_commit(res.commit).parents == repo.read_commit(res.commit).parents
    repo.delete_branch("exp")
    repo.gc(grace_seconds=0)
    assert repo.fsck().ok
    out = tmp_path / "after-gc"
    repo.checkout(res.commit, output=out)
    assert sha256(out / "model.safetensors") == sha256(repo.root / "model.safetensors")
    graph = cli(repo.root, "log", "--graph", "--oneline").output
    assert graph.splitlines()[0].startswith("*") and any(line.strip().startswith("|") for line in graph.splitlines())
    diffs = [repo.diff(p, res.commit) for p in repo.read_commit(res.commit).parents]
    assert all(d["tensors"] for d in diffs)


def test_pull_merge_merges_a_diverged_upstream(tmp_path):
    a = Repo.init(tmp_path / "a")
    base = weights(0)
    save(a, base, "base")
    a.remote_add("origin", str(tmp_path / "remote"))
    a.push()
    b = clone(str(tmp_path / "remote"), tmp_path / "b")
    save(a, {**base, "a": nudge(base["a"], 1)}, "a trains a")
    a.push()
    save(b, {**base, "c": nudge(base["c"], 2)}, "b trains c")
    with pytest.raises(WvcError, match="pull --merge"):
        b.pull()
    res = b.pull(merge=True)
    assert res["merged"] and len(b.read_commit(b.head()).parents) == 2
    merged = load_file(str(b.root / "model.safetensors"))
    assert torch.equal(merged["a"].view(torch.int16), nudge(base["a"], 1).view(torch.int16))
    assert torch.equal(merged["c"].view(torch.int16), nudge(base["c"], 2).view(torch.int16))
    b.push()  # a fast-forward of the remote


@pytest.mark.parametrize("strategy", sorted(MERGEKIT))
def test_methods_agree_with_mergekit_on_tensors_larger_than_its_chunks(strategy):
    """mergekit sums slerp's norms over chunks of 2^20 elements: a 3M-element tensor checks that
    wvc rounds the same way (the other methods have no chunking)."""
    from mergekit.merge_methods.api import merge_tensors

    from wvc.model.merge_methods import MergeParameters, merge_tensor, tensor_seed

    g = torch.Generator().manual_seed(5)
    base = (torch.randn(3000, 1000, generator=g) * 0.02).to(torch.bfloat16)
    sides = {"base": base, "ours": nudge(base, 6, 1e-2), "theirs": nudge(base, 7, 1e-2)}
    method, inputs, base_index, params = MERGEKIT[strategy]
    torch.manual_seed(tensor_seed(11, "w"))
    expected = merge_tensors([sides[k].float() for k in inputs], method, parameters=params, base_index=base_index,
                             dtype=torch.float32, out_dtype=torch.bfloat16)
    got = merge_tensor(strategy, base, sides["ours"], sides["theirs"],
                       MergeParameters(0.7, 0.3, density=0.6, lam=0.8, seed=11, t=0.3), "w")
    assert torch.equal(got.view(torch.int16), expected.view(torch.int16))
