"""File ids: a file's id is derived from its chunk list (tree format 2), and format-1 trees,
whose ids hash the file's bytes, still read, check out and commit on."""

import dataclasses
import os

import pytest
import torch
from safetensors.torch import save_file

from tests.conftest import sha256
from wvc import Repo, ids
from wvc.errors import CorruptObject, FormatError
from wvc.model.versions import TREE_FORMAT, Commit, Tree
from wvc.store.refs import HEADS
from wvc.worktree.scan import content_id

CHUNK = 4096  # small, so every tensor and blob below spans several chunks


@pytest.fixture
def small_repo(tmp_path):
    r = Repo.init(tmp_path / "model", chunk_bytes=CHUNK)
    yield r
    r.close()


def write_model(root, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    save_file({
        "emb": torch.randn(100, 33, generator=g).to(torch.bfloat16),  # 6600 bytes: 2 chunks
        "w": torch.randn(50, 50, generator=g),  # F32, 10000 bytes: 3 chunks
        "ids": torch.arange(1001, dtype=torch.int64),  # 8008 bytes, width 8
        "empty": torch.zeros(0, 4),
    }, str(root / "model.safetensors"), metadata={"seed": str(seed)})
    (root / "config.json").write_bytes(os.urandom(9000))  # a blob of 3 chunks
    (root / "empty.txt").write_bytes(b"")


def test_a_working_file_has_the_id_its_commit_records(small_repo):
    write_model(small_repo.root, 0)
    small_repo.commit("c")
    tree = small_repo.tree_of("HEAD")
    assert tree.format == TREE_FORMAT
    for entry in tree.files:
        assert entry.hash == entry.content_id
        assert content_id(small_repo.root / entry.path, entry.path, tree.chunk_bytes) == entry.hash, entry.path
    # any other chunking gives other ids: a file's id is only compared within one chunk size
    entry = tree.by_path()["model.safetensors"]
    assert content_id(small_repo.root / entry.path, entry.path, 2 * CHUNK) != entry.hash


def test_a_damaged_safetensors_header_reads_as_modified(small_repo):
    write_model(small_repo.root, 0)
    small_repo.commit("c")
    path = small_repo.root / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[9] = ord("!")  # inside the JSON header
    path.write_bytes(bytes(data))
    assert small_repo.status().modified == ["model.safetensors"]


def test_a_format_2_tree_whose_file_hash_does_not_match_its_chunks_is_refused(small_repo):
    write_model(small_repo.root, 0)
    small_repo.commit("c")
    tree = small_repo.tree_of("HEAD")
    lying = dataclasses.replace(tree.files[0], hash=ids.digest(ids.FILE_LISTING, b"something else"))
    forged = Tree((lying, *tree.files[1:]), tree.chunk_bytes)
    with pytest.raises(FormatError, match="does not match its chunk list"):
        Tree.from_bytes(forged.to_bytes())


def _as_format_1(repo, commit_id: str, *, lie_about: str | None = None) -> str:
    """Re-record ``commit_id`` as an older wvc did: a format-1 tree whose file hashes are
    ids.FILE digests of the files' bytes. Returns the new commit's id."""
    tree = repo.tree_of(commit_id)
    out = repo.root.parent / "v1-src"
    repo.checkout(commit_id, output=out, force=True)
    files = []
    for f in tree.files:
        digest = ids.digest(ids.FILE, (out / f.path).read_bytes())
        if f.path == lie_about:
            digest = ids.digest(ids.FILE, b"not these bytes")
        files.append(dataclasses.replace(f, hash=digest))
    old_tree = Tree(tuple(files), tree.chunk_bytes, format=1)
    assert Tree.from_bytes(old_tree.to_bytes()) == old_tree  # format 1 parses, hashes unchecked
    commit = Commit(old_tree.id, (), "a", 0, "made by an older wvc")
    with repo.internals.db.write():
        repo.internals.db.conn.execute("INSERT INTO trees VALUES (?, ?)", (old_tree.id, old_tree.to_bytes()))
        repo.internals.db.conn.execute("INSERT INTO commits VALUES (?, ?, ?, ?, ?)",
                             (commit.id, old_tree.id, 0, 0, commit.to_bytes()))
        repo.internals.refs.set(HEADS + "old", commit.id, None, "test: format 1")
    return commit.id


def test_a_format_1_history_checks_out_reads_clean_and_commits_on(small_repo):
    write_model(small_repo.root, 0)
    expected = {p: sha256(small_repo.root / p) for p in ("model.safetensors", "config.json", "empty.txt")}
    first = small_repo.commit("c").commit
    old = _as_format_1(small_repo, first)
    small_repo.checkout("old", force=True)
    assert {p: sha256(small_repo.root / p) for p in expected} == expected
    assert small_repo.status().clean  # compared by content id, derived from the old entries
    write_model(small_repo.root, 1)
    (small_repo.root / "empty.txt").unlink()
    res = small_repo.commit("on top of a format-1 commit")
    tree = small_repo.tree_of(res.commit)
    assert tree.format == TREE_FORMAT and all(f.hash == f.content_id for f in tree.files)
    assert small_repo.status().clean
    out = small_repo.root.parent / "back"
    small_repo.checkout(old, output=out)
    assert {p: sha256(out / p) for p in expected} == expected


def test_a_format_1_file_hash_that_does_not_match_the_bytes_fails_checkout(small_repo):
    write_model(small_repo.root, 0)
    first = small_repo.commit("c").commit
    _as_format_1(small_repo, first, lie_about="config.json")
    out = small_repo.root.parent / "out"
    with pytest.raises(CorruptObject, match="config.json: rebuilt file does not match"):
        small_repo.checkout("old", output=out)
    assert not (out / "config.json").exists()


def test_a_base_recorded_in_tree_format_1_still_attaches_and_a_changed_one_is_refused(tmp_path):
    from tests.test_base_model import make_base
    from wvc.basemodel.setup import set_base
    from wvc.basemodel.base_ref import BaseRef, base_commit
    from wvc.errors import BaseModelError as BaseError

    base_folder = tmp_path / "base"
    make_base(base_folder)
    first = Repo.init(tmp_path / "a", base=str(base_folder))
    tree = first.tree_of(first.base().commit)
    old = Tree(tuple(dataclasses.replace(f, hash=ids.digest(ids.FILE, (base_folder / f.path).read_bytes()))
                     for f in tree.files), tree.chunk_bytes, format=1)
    recorded = BaseRef(str(base_folder), old.id, base_commit(str(base_folder), old.id).id)  # as an older wvc
    second = Repo.init(tmp_path / "b")
    ref = set_base(second.internals, str(base_folder), expected=recorded, expected_tree=old)
    assert (ref.tree, ref.commit) == (recorded.tree, recorded.commit)  # the history's ids hold
    assert second.tree_of(ref.commit).format == 1
    (base_folder / "config.json").write_text("{}")
    with pytest.raises(BaseError, match="does not match the one this history was made from"):
        set_base(Repo.init(tmp_path / "c").internals, str(base_folder), expected=recorded, expected_tree=old)
