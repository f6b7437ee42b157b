"""Tree deltas (model/tree_diff.py): a remote catalog stores a step's tree as the chunk ids that
changed against its parent's tree, so a step's metadata is proportional to what changed, and
every reader still gets (and checks) the whole tree."""

import hashlib

import pytest
import torch

import wvc
from wvc import Repo, ids
from wvc.model import tree_diff
from wvc.remotes import open_backend
from wvc.remotes.catalog import Catalog, catalog_name, parse_catalog
from wvc.remotes.interface import Handle
from wvc.remotes.layout import catalog_path
from wvc.remotes.repository import RemoteRepository

from tests.test_hostile_remotes import one_line_error, run_wvc

CHUNK = 256  # bytes: 4,000 chunks a version in a 1 MB tensor


def digest_dir(path) -> dict:
    return {p.relative_to(path).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file() and ".wvc" not in p.parts}


def catalogs(url: str) -> list[Catalog]:
    remote = RemoteRepository.open(open_backend(url))
    return [parse_catalog(remote.backend.read(Handle("catalog", c), 1 << 30), c) for c in remote.state.catalogs]


def stepping_repo(tmp_path, steps: int, changed: int = 40):
    """A 1 MB tensor in 256-byte chunks; each step changes ``changed`` chunks; pushed each step."""
    url = str(tmp_path / "remote")
    repo = Repo.init(tmp_path / "a", chunk_bytes=CHUNK)
    repo.remote_add("origin", url)
    g = torch.Generator().manual_seed(0)
    w = torch.randn((1 << 20) // 4, generator=g)
    commits = []
    for i in range(steps):
        if i:
            places = torch.randperm(w.numel() // (CHUNK // 4), generator=g)[:changed] * (CHUNK // 4)
            w[places] += 1e-3
        commits.append(repo.commit(f"step {i}", source={"w": w.clone()}, branch="main").commit)
        repo.push()
    return repo, url, commits


def test_a_step_sends_the_chunk_ids_it_changed_and_a_clone_gets_every_version_exact(tmp_path):
    repo, url, commits = stepping_repo(tmp_path, 3)
    whole = len(repo.internals.graph.tree_bytes(repo.read_commit(commits[-1]).tree))
    stored = {}
    for cat in catalogs(url):
        stored.update(cat.trees)
    assert not tree_diff.is_delta(stored[repo.read_commit(commits[0]).tree])  # the first: whole
    for cid in commits[1:]:
        data = stored[repo.read_commit(cid).tree]
        assert tree_diff.is_delta(data)
        base, changes = tree_diff.parse_delta(data, "test")
        assert base == repo.read_commit(repo.read_commit(cid).parents[0]).tree
        assert len(changes) == 40
        assert len(data) < whole / 20  # 40 of 4,096 chunk ids, not all of them
    clone = wvc.clone(url, tmp_path / "b")
    assert tree_diff.is_delta(clone.internals.graph.stored_tree(repo.read_commit(commits[1]).tree))  # (fetched into a delta)
    for cid in commits:
        repo.checkout(cid, force=True)
        clone.checkout(cid, force=True)
        assert digest_dir(tmp_path / "b") == digest_dir(tmp_path / "a")
        assert clone.internals.graph.tree_bytes(clone.read_commit(cid).tree) == repo.internals.graph.tree_bytes(repo.read_commit(cid).tree)


def test_a_chain_of_tree_deltas_is_bounded_and_every_version_reads_back(tmp_path, monkeypatch):
    monkeypatch.setattr(tree_diff, "MAX_DELTA_DEPTH", 3)
    repo, url, commits = stepping_repo(tmp_path, 10, changed=4)
    stored = {}
    for cat in catalogs(url):  # (compaction merged some segments: deltas travel as they are)
        stored.update(cat.trees)
    depths = [tree_diff.chain(repo.read_commit(c).tree, lambda t: (len(stored[t]), stored[t]) if t in stored else None)[0]
              for c in commits]
    assert depths == [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]
    remote = RemoteRepository.open(open_backend(url))
    for cid in reversed(commits):  # newest first, as a fetch walks
        tid = repo.read_commit(cid).tree
        assert remote.tree(tid).to_bytes() == repo.internals.graph.tree_bytes(tid)


def test_a_whole_tree_is_stored_when_more_than_chunk_ids_changed(tmp_path):
    url = str(tmp_path / "remote")
    repo = Repo.init(tmp_path / "a", chunk_bytes=CHUNK)
    repo.remote_add("origin", url)
    w = torch.zeros(4096)
    repo.commit("one", source={"w": w}, branch="main")
    repo.push()
    second = repo.commit("two", source={"w": w, "v": torch.ones(8)}, branch="main").commit  # a new tensor
    repo.push()
    stored = {t: d for cat in catalogs(url) for t, d in cat.trees.items()}
    assert not tree_diff.is_delta(stored[repo.read_commit(second).tree])


def test_a_delta_whose_tree_is_not_its_id_is_refused_with_one_line(tmp_path):
    repo, url, commits = stepping_repo(tmp_path, 2)
    remote = RemoteRepository.open(open_backend(url))
    victim = repo.read_commit(commits[1]).tree
    for name in remote.state.catalogs:
        data = remote.backend.read(Handle("catalog", name), 1 << 30)
        cat = parse_catalog(data, name)
        if victim in cat.trees:
            base, changes = tree_diff.parse_delta(cat.trees[victim], "test")
            changes[0][3] = changes[1][3]  # a valid chunk id, at the wrong place
            cat.trees[victim] = tree_diff.encode_delta(base, changes)
            forged = cat.to_bytes()
            (tmp_path / "remote" / catalog_path(name)).unlink()
            (tmp_path / "remote" / catalog_path(catalog_name(forged))).write_bytes(forged)
    r, _ = run_wvc(tmp_path, "clone", url, tmp_path / "dest")
    assert "does not give its id" in one_line_error(r)
    assert not (tmp_path / "dest").exists()


@pytest.mark.parametrize("forge", ["loop", "garbage", "missing base"])
def test_malformed_tree_deltas_are_refused(forge):
    a, b = "a" * 64, "b" * 64
    stored = {"loop": {a: tree_diff.encode_delta(b, []), b: tree_diff.encode_delta(a, [])},
              "garbage": {a: tree_diff.DELTA_MAGIC + b'{"base": 3}'},
              "missing base": {a: tree_diff.encode_delta(b, [])}}[forge]
    with pytest.raises(wvc.errors.CorruptObject):
        tree_diff.resolve(a, stored.get, lambda t: None)


def test_remote_gc_keeps_the_trees_kept_deltas_are_read_from(tmp_path):
    repo, url, commits = stepping_repo(tmp_path, 4, changed=4)
    remote = RemoteRepository.open(open_backend(url))
    tip_tree = repo.read_commit(commits[-1]).tree
    trees = remote.tree_bases({tip_tree})
    assert trees == {repo.read_commit(c).tree for c in commits}  # the chain down to the whole tree
    repo.remote_gc("origin")
    clone = wvc.clone(url, tmp_path / "b")
    for cid in commits:
        assert clone.internals.graph.tree_bytes(clone.read_commit(cid).tree) == repo.internals.graph.tree_bytes(repo.read_commit(cid).tree)


def test_the_local_database_keeps_a_step_tree_as_a_delta_and_reads_every_version_back(tmp_path):
    repo, _, commits = stepping_repo(tmp_path, 4)
    whole = len(repo.internals.graph.tree_bytes(repo.read_commit(commits[0]).tree))
    trees = [repo.read_commit(c).tree for c in commits]
    stored = [repo.internals.graph.stored_tree(t) for t in trees]
    assert not tree_diff.is_delta(stored[0])
    assert all(tree_diff.is_delta(d) and len(d) < whole / 20 for d in stored[1:])
    fresh = Repo.open(tmp_path / "a")  # nothing cached: every delta resolved from the database
    for tid in reversed(trees):
        assert fresh.internals.read_tree(tid).id == tid
        assert ids.digest(ids.TREE, fresh.internals.graph.tree_bytes(tid)) == tid
    assert fresh.fsck().errors == []


def test_a_kept_delta_keeps_the_tree_it_is_read_from(tmp_path):
    repo, _, commits = stepping_repo(tmp_path, 2)
    graph = repo.internals.graph
    first, second = (repo.read_commit(c).tree for c in commits)
    with repo.internals.db.write():
        graph.delete_commits([commits[0], commits[1]])
        graph.delete_unreferenced_trees(keep=[second])  # the first tree: no commit, but the second's base
    assert graph.has_tree(first)
    assert Repo.open(tmp_path / "a").internals.read_tree(second).id == second
    with repo.internals.db.write():
        graph.delete_unreferenced_trees()
    assert not graph.has_tree(first) and not graph.has_tree(second)


def test_a_wvc_that_predates_tree_deltas_refuses_the_repository_once_one_is_stored(tmp_path, monkeypatch):
    """It would read a delta as a damaged tree: the first delta marks the repository format 2,
    in its own transaction, which such a wvc (accepting format 1 only) refuses with one line."""
    import wvc.repo
    from wvc.errors import FormatError

    repo = Repo.init(tmp_path / "a")
    repo.commit("first", source={"w": torch.zeros(4096)})
    assert repo.internals.db.get_config("format") == "1"  # one whole tree: what any wvc reads
    repo.close()
    _, _, commits = stepping_repo(tmp_path / "b", 2)
    again = Repo.open(tmp_path / "b" / "a")
    assert tree_diff.is_delta(again.internals.graph.stored_tree(again.read_commit(commits[1]).tree))
    assert again.internals.db.get_config("format") == "2"
    again.close()
    monkeypatch.setattr(wvc.repo, "FORMATS", ("1",))  # the check as it was before tree deltas
    Repo.open(tmp_path / "a").close()
    with pytest.raises(FormatError, match="format '2' is not supported"):
        Repo.open(tmp_path / "b" / "a")
