"""Counts from a remote are bounded while parsing, and refused with one line (issue 37,
finding 27: 100,000 branches made a clone take 98 s; a 1,000,000-entry tree left a lazy
clone unfinished after 20 minutes; a 2,000,000-entry catalog was refused only after a 1.6 GB
parse)."""

import json
import struct
import time

import zstandard

from wvc.model.versions import MAX_TREE_FILES, Commit, FileEntry, Tree
from wvc.remotes.catalog import MAGIC, catalog_name
from wvc.remotes.layout import MAX_REMOTE_REFS, commit_path, tree_path

from .test_everyday import run


def _remote_with_tree(root, n_files: int) -> str:
    files = tuple(FileEntry.of(f"f{i:07d}", "blob", 0, chunks=()) for i in range(n_files))
    tree = Tree(files, 4 << 20)
    commit = Commit(tree.id, (), "mallory", 1, "many", {})
    out = {"wvc.json": b'{"format": 1}', tree_path(tree.id): tree.to_bytes(), commit_path(commit.id): commit.to_bytes(),
           "refs/heads/main": (commit.id + "\n").encode()}
    for path, data in out.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)
    return commit.id


def test_a_tree_with_more_files_than_allowed_is_refused(tmp_path):
    _remote_with_tree(tmp_path / "ok", 1000)
    run(tmp_path, "clone", "--lazy", tmp_path / "ok", "ok-clone")  # a big but sane tree passes
    _remote_with_tree(tmp_path / "remote", MAX_TREE_FILES + 1)
    for args in (("clone", "--lazy"), ("clone",)):
        start = time.monotonic()
        r = run(tmp_path, *args, tmp_path / "remote", "c", check=False)
        assert r.returncode == 1 and "more than wvc takes" in r.stderr and len(r.stderr.strip().splitlines()) == 1
        assert time.monotonic() - start < 60
        assert not (tmp_path / "c").exists()


def test_a_remote_with_more_refs_than_allowed_is_refused_before_reading_them(tmp_path):
    commit = _remote_with_tree(tmp_path / "remote", 1)
    heads = tmp_path / "remote" / "refs" / "heads"
    for i in range(MAX_REMOTE_REFS):
        (heads / f"b{i}").write_text(commit + "\n")
    r = run(tmp_path, "clone", tmp_path / "remote", "c", check=False)
    assert r.returncode == 1 and f"more than wvc reads ({MAX_REMOTE_REFS})" in r.stderr, r.stderr
    assert not (tmp_path / "c").exists()


def test_a_catalog_header_larger_than_an_index_is_refused_before_parsing(tmp_path):
    _remote_with_tree(tmp_path / "remote", 1)
    entries = [{"id": "0" * 64, "offset": 0, "length": 1, "raw_size": 1, "method": 0, "base": None}] * 800_000  # ~90 MB of JSON
    meta = json.dumps({"pack": None, "entries": entries, "objects": []}).encode()
    data = zstandard.ZstdCompressor().compress(MAGIC + struct.pack("<I", len(meta)) + meta)
    (tmp_path / "remote" / "catalogs").mkdir()
    (tmp_path / "remote" / "catalogs" / f"{catalog_name(data)}.cat").write_bytes(data)
    r = run(tmp_path, "clone", tmp_path / "remote", "c", check=False)
    assert r.returncode == 1 and "more than a pack index may hold" in r.stderr, r.stderr
