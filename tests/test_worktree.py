"""Status, .wvcignore, symlinks, the stat cache, and checkout's handling of local work."""

import os

import pytest
import torch
from safetensors.torch import save_file

from wvc.errors import UncommittedChanges
from wvc.worktree.scan import RACY_MARGIN_NS

from .conftest import sha256


def age(path, seconds=10):
    """Backdate a file so the stat cache may trust it (it distrusts very fresh mtimes)."""
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns - seconds * 1_000_000_000))


def test_status_reports_added_modified_deleted(repo):
    (repo.root / "a.txt").write_text("a")
    (repo.root / "b.txt").write_text("b")
    repo.commit("one")
    (repo.root / "a.txt").write_text("changed")
    (repo.root / "b.txt").unlink()
    (repo.root / "c.txt").write_text("new")
    st = repo.status()
    assert (st.modified, st.deleted, st.added) == (["a.txt"], ["b.txt"], ["c.txt"])


def test_wvcignore_excludes_paths(repo):
    (repo.root / ".wvcignore").write_text("optimizer.pt\nruns/\n*.tmp\n")
    (repo.root / "optimizer.pt").write_bytes(b"x" * 100)
    (repo.root / "runs").mkdir()
    (repo.root / "runs" / "events").write_text("log")
    (repo.root / "w.tmp").write_text("t")
    (repo.root / "keep.json").write_text("{}")
    repo.commit("c")
    paths = [f.path for f in repo.tree_of("HEAD").files]
    assert paths == [".wvcignore", "keep.json"]


def test_ignore_patterns_from_the_file_and_the_caller_combine(repo, tmp_path):
    from wvc.worktree.scan import scan

    for name in ("a.txt", "b.log", "c.tmp"):
        (repo.root / name).write_text(name)
    assert scan(repo.root, ("*.log",)).files == ["a.txt", "c.tmp"]  # no ignore file: the caller's only
    (repo.root / ".wvcignore").write_text("# comments and blank lines match nothing\n\n")
    assert scan(repo.root).files == [".wvcignore", "a.txt", "b.log", "c.tmp"]
    (repo.root / ".wvcignore").write_text("*.tmp\n")
    assert scan(repo.root, ("*.log",)).files == [".wvcignore", "a.txt"]


def test_status_without_ignore_patterns_does_not_import_pathspec(repo):
    """pathspec costs ~15 ms of every command's start; a tree with nothing to ignore skips it."""
    import subprocess
    import sys

    (repo.root / "a.txt").write_text("a")
    probe = "import sys, wvc; wvc.Repo.open(sys.argv[1]).status(); print('pathspec' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", probe, str(repo.root)], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "False", r.stderr
    (repo.root / ".wvcignore").write_text("*.tmp\n")
    r = subprocess.run([sys.executable, "-c", probe, str(repo.root)], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "True", r.stderr


def test_file_symlinks_commit_their_content_and_directory_symlinks_are_reported(repo, tmp_path):
    target = tmp_path / "blob"
    target.write_text("the file's content")
    (repo.root / "link").symlink_to(target)
    (repo.root / "dirlink").symlink_to(tmp_path)
    (repo.root / "dangling").symlink_to(tmp_path / "nothing-here")
    (repo.root / "real.txt").write_text("real")
    res = repo.commit("c")
    assert [f.path for f in repo.tree_of("HEAD").files] == ["link", "real.txt"]
    assert res.linked_files == ["link"] and res.skipped_symlinks == ["dangling", "dirlink"]
    from wvc.read.view import open_version

    assert open_version(repo.root).read_file("link") == b"the file's content"
    st = repo.status()
    assert st.skipped_symlinks == ["dangling", "dirlink"] and st.clean


def test_stat_cache_avoids_rehashing_unchanged_files(repo, monkeypatch):
    (repo.root / "big.bin").write_bytes(os.urandom(1 << 20))
    age(repo.root / "big.bin")
    repo.commit("c")
    repo.status()  # records trustworthy entries
    import wvc.worktree.scan as wt

    calls = []
    real = wt.content_id
    monkeypatch.setattr(wt, "content_id", lambda *a: calls.append(a[0]) or real(*a))
    assert repo.status().clean
    assert calls == []
    (repo.root / "big.bin").write_bytes(os.urandom(1 << 20))  # same size, new content
    assert repo.status().modified == ["big.bin"]
    assert len(calls) == 1


def test_fresh_files_are_rehashed_not_trusted(repo, monkeypatch):
    """A file modified within the racy window is hashed again even if its stat matches."""
    p = repo.root / "f.bin"
    p.write_bytes(b"a" * 10)
    repo.commit("c")
    st = os.stat(p)
    assert st.st_mtime_ns > os.stat(repo.root).st_mtime_ns - RACY_MARGIN_NS
    p.write_bytes(b"b" * 10)
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size and mtime, new content
    assert repo.status().modified == ["f.bin"]


def test_unchanged_shards_are_not_reread_on_commit(repo, monkeypatch):
    for i in range(2):
        save_file({"w": torch.randn(256)}, str(repo.root / f"s{i}.safetensors"))
        age(repo.root / f"s{i}.safetensors")
    repo.commit("one")
    repo.status()
    save_file({"w": torch.randn(256)}, str(repo.root / "s1.safetensors"))
    import wvc.worktree.chunking as chunking

    read = []
    real = chunking.TreeBuilder._safetensors_file
    monkeypatch.setattr(chunking.TreeBuilder, "_safetensors_file", lambda self, path, *a: read.append(path) or real(self, path, *a))
    repo.commit("two")
    assert read == ["s1.safetensors"]


def test_checkout_carries_local_changes_to_untouched_files(repo):
    (repo.root / "notes.txt").write_text("v1")
    (repo.root / "w.bin").write_bytes(b"1")
    repo.commit("one")
    (repo.root / "w.bin").write_bytes(b"2")
    repo.commit("two")
    (repo.root / "notes.txt").write_text("my local edit")
    repo.checkout("HEAD~1")  # notes.txt is the same in both commits: the edit survives
    assert (repo.root / "notes.txt").read_text() == "my local edit"
    assert (repo.root / "w.bin").read_bytes() == b"1"


def test_checkout_refuses_untracked_file_in_the_way(repo):
    (repo.root / "a.txt").write_text("a")
    repo.commit("one")
    (repo.root / "b.txt").write_text("b")
    repo.commit("two")
    repo.checkout("HEAD~1")
    assert not (repo.root / "b.txt").exists()
    (repo.root / "b.txt").write_text("untracked, precious")
    with pytest.raises(UncommittedChanges):
        repo.checkout("main")
    assert (repo.root / "b.txt").read_text() == "untracked, precious"


def test_checkout_output_refuses_non_empty_dir(repo, tmp_path):
    (repo.root / "a.txt").write_text("a")
    repo.commit("one")
    out = tmp_path / "out"
    out.mkdir()
    (out / "x").write_text("x")
    from wvc.errors import WvcError

    with pytest.raises(WvcError, match="not empty"):
        repo.checkout("HEAD", output=out)
    repo.checkout("HEAD", output=tmp_path / "fresh")
    assert sha256(tmp_path / "fresh" / "a.txt") == sha256(repo.root / "a.txt")


def test_nothing_to_commit(repo):
    from wvc.errors import NothingToCommit

    (repo.root / "a.txt").write_text("a")
    repo.commit("one")
    with pytest.raises(NothingToCommit):
        repo.commit("again")
