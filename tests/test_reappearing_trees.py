"""A version seen before, committed and pushed again (a revert, a trainer restarted from its
start directory, a merge that gives one side's tree), reads back byte-identical through every
reader: clone, ``wvc.open``, ``snapshot_download`` and a follower (issue 64, finding 1).

A remote stores each tree once: a push that stored a tree the remote held already, as a delta
of its parent's tree, made that tree's chain of delta bases loop back to itself. Remotes that an
older wvc wrote that way still read (a whole form wins over a delta), say what is wrong in one
line where no whole form is left, and are repaired by the next push."""

import hashlib

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import wvc
from wvc import Repo
from wvc.model import tree_diff
from wvc.remotes import open_backend, segment
from wvc.remotes.catalog import catalog_name, parse_catalog
from wvc.remotes.interface import Handle
from wvc.remotes.layout import catalog_path
from wvc.remotes.repository import RemoteRepository

from tests.test_hostile_remotes import one_line_error, run_wvc

CHUNK = 256


def weights(variant: int) -> dict:
    """Version ``variant`` of a small model: a 4,096-element tensor in 64 chunks, each variant
    a few elements away from variant 0 (so trees differ in chunk ids only: tree deltas)."""
    w = torch.randn(4096, generator=torch.Generator().manual_seed(0))
    if variant:
        g = torch.Generator().manual_seed(variant)
        w[torch.randperm(4096, generator=g)[:3]] += float(variant)
    return {"w": w, "b": torch.arange(8, dtype=torch.float32) * variant}


def digest(state: dict) -> dict:
    return {k: hashlib.sha256(v.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()
            for k, v in sorted(state.items())}


def file_digests(root) -> dict:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and ".wvc" not in p.parts}


def check_every_reader(repo: Repo, url: str, commits: list[str], tmp_path, tag: str) -> None:
    """Each commit of ``commits`` through clone (checked out), wvc.open, snapshot_download and
    a follower, byte for byte against the local repository's version."""
    clone = wvc.clone(url, tmp_path / f"clone-{tag}")
    follower = wvc.follow(url, "main")
    for n, cid in enumerate(commits):
        out = tmp_path / f"local-{tag}-{n}"
        repo.checkout(cid, output=out)
        expected_files = file_digests(out)
        expected_tensors = digest(repo.load_state_dict(cid))
        clone.checkout(cid, output=tmp_path / f"cloned-{tag}-{n}")
        assert file_digests(tmp_path / f"cloned-{tag}-{n}") == expected_files
        assert digest(wvc.open(url, cid).state_dict()) == expected_tensors
        got = wvc.snapshot_download(url, cid, cache_dir=tmp_path / f"cache-{tag}")
        assert file_digests(got) == expected_files
        follower.update(cid)
        assert follower.commit == cid
        assert digest(follower.state_dict) == expected_tensors


def test_a_reverted_version_pushed_again_reads_back_through_every_reader(remote_url, hub_env, tmp_path):
    repo = Repo.init(tmp_path / "a", chunk_bytes=CHUNK)
    repo.remote_add("origin", remote_url)
    commits = []
    for variant in (0, 1, 0):  # A, B, then A's content again: a revert
        commits.append(repo.commit(f"v{variant}", source=weights(variant), branch="main").commit)
        repo.push()
    assert repo.read_commit(commits[0]).tree == repo.read_commit(commits[2]).tree
    check_every_reader(repo, remote_url, commits, tmp_path, "revert")


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.one_of(st.tuples(st.just("commit"), st.integers(0, 3)),
                          st.tuples(st.just("revert"), st.integers(0, 30)),
                          st.tuples(st.just("merge"), st.integers(0, 3))), min_size=2, max_size=9),
       st.booleans())
def test_any_history_with_repeated_reverted_and_merged_trees_reads_back(tmp_path_factory, ops, push_each):
    """Histories of commits drawn from 4 contents (so trees repeat), reverts to an earlier
    commit's content, and merges (a branch whose tree is one of the 4 merged with ``ours``,
    which gives main's tree again); pushed after every step or once at the end."""
    tmp_path = tmp_path_factory.mktemp("history")
    url = str(tmp_path / "remote")
    repo = Repo.init(tmp_path / "a", chunk_bytes=CHUNK)
    repo.remote_add("origin", url)
    commits = [repo.commit("start", source=weights(0), branch="main").commit]
    for n, (op, arg) in enumerate(ops):
        if op == "commit":
            commits.append(repo.commit(f"{n}", source=weights(arg), branch="main", allow_empty=True).commit)
        elif op == "revert":
            earlier = commits[arg % len(commits)]
            commits.append(repo.commit(f"revert {n}", source=repo.load_state_dict(earlier), branch="main",
                                       allow_empty=True).commit)
        else:
            repo.create_branch(f"side{n}", "main")
            commits.append(repo.commit(f"side {n}", source=weights(arg), branch=f"side{n}", allow_empty=True).commit)
            repo.checkout("main", force=True)
            merged = repo.merge(f"side{n}", strategy="ours", message=f"merge {n}")
            commits.append(merged.commit)
            repo.push(branch=f"side{n}") if push_each else None
        if push_each:
            repo.push()
    repo.push()
    check_every_reader(repo, url, commits, tmp_path, "history")


def _older_wvc_stored_trees(graph, live_segments, new_commits):
    """What a push stored before the fix: a tree the remote held already stored again, as a
    delta of its parent's tree (so its chain loops back to itself)."""
    out = {}
    for cid in new_commits:
        commit = graph.read_commit(cid)
        parent = graph.read_commit(commit.parents[0]).tree if commit.parents else None
        changes = None if parent in (None, commit.tree) else tree_diff.diff_trees(graph.read_tree(parent),
                                                                                  graph.read_tree(commit.tree))
        out[commit.tree] = graph.tree_bytes(commit.tree) if changes is None else tree_diff.encode_delta(parent, changes)
    return out


def older_wvc_remote(tmp_path, monkeypatch) -> tuple[Repo, str, list[str]]:
    """A directory remote an older wvc wrote: A, B, A pushed, the second A stored as a delta of B."""
    url = str(tmp_path / "remote")
    repo = Repo.init(tmp_path / "a", chunk_bytes=CHUNK)
    repo.remote_add("origin", url)
    commits = []
    with monkeypatch.context() as m:
        m.setattr(segment, "stored_trees", _older_wvc_stored_trees)
        for variant in (0, 1, 0):
            commits.append(repo.commit(f"v{variant}", source=weights(variant), branch="main").commit)
            repo.push()
    return repo, url, commits


def drop_whole_forms(tmp_path, url: str, tree: str) -> None:
    """Leave ``tree`` only as a delta on the remote (as a compaction that kept the delta did)."""
    remote = RemoteRepository.open(open_backend(url))
    for name in remote.state.catalogs:
        cat = parse_catalog(remote.backend.read(Handle("catalog", name), 1 << 30), name)
        if tree in cat.trees and not tree_diff.is_delta(cat.trees[tree]):
            del cat.trees[tree]
            forged = cat.to_bytes()
            (tmp_path / "remote" / catalog_path(name)).unlink()
            (tmp_path / "remote" / catalog_path(catalog_name(forged))).write_bytes(forged)


def test_a_remote_an_older_wvc_looped_reads_from_the_whole_form_it_still_holds(tmp_path, monkeypatch):
    repo, url, commits = older_wvc_remote(tmp_path, monkeypatch)
    stored = [cat.trees.get(repo.read_commit(commits[0]).tree) for cat in map(
        lambda n: parse_catalog(open_backend(url).read(Handle("catalog", n), 1 << 30), n),
        RemoteRepository.open(open_backend(url)).state.catalogs)]
    assert sorted(tree_diff.is_delta(s) for s in stored if s is not None) == [False, True]  # the loop is there
    check_every_reader(repo, url, commits, tmp_path, "older")


def test_a_looping_remote_says_so_in_one_line_and_the_next_push_repairs_it(tmp_path, monkeypatch):
    repo, url, commits = older_wvc_remote(tmp_path, monkeypatch)
    drop_whole_forms(tmp_path, url, repo.read_commit(commits[0]).tree)
    r, _ = run_wvc(tmp_path, "clone", url, tmp_path / "dest")
    assert "loop" in one_line_error(r)
    assert not (tmp_path / "dest").exists()
    commits.append(repo.commit("v2", source=weights(2), branch="main").commit)
    repo.push()  # repairs: the looping trees go up whole
    check_every_reader(repo, url, commits, tmp_path, "repaired")
