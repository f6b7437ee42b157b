"""Names a tree may not hold, whoever made it (issue 37, findings 18 and 20): no `.git` (nor
`.wvc`) component in any spelling a file system folds to it, and no two paths that are one
name on case-insensitive or Unicode-normalising file systems. A hostile remote's tree with
`.git/config` or `.git/hooks/*` is refused by clone and pull, and nothing is written."""

import json
import os
from pathlib import Path

import pytest

from wvc import Repo, clone, codec, ids
from wvc.errors import FormatError, UnsafePath
from wvc.formats.dtypes import BYTES
from wvc.fsutil import reserved_name, validate_relpath
from wvc.model.versions import Commit, FileEntry, Tree
from wvc.remotes.layout import commit_path, pack_path, tree_path

from .conftest import tree_digests
from .test_everyday import run
from .test_hostile_remotes import pack_bytes

HOOK = b"#!/bin/sh\ntouch /tmp/wvc-pwned\n"
FSMONITOR = b"[core]\n\tfsmonitor = touch /tmp/wvc-pwned-fsmonitor\n"


def hostile_remote(root: Path, files: dict[str, bytes], parent: str | None = None, extra_refs=None) -> str:
    """A directory remote whose main holds a commit of exactly ``files`` (no validation of
    names: what an attacker with write access to a remote can make). Returns the commit id."""
    entries, objects = [], []
    for path, data in sorted(files.items()):
        enc = codec.encode(data, BYTES)
        oid = ids.chunk_id(data)
        objects.append((oid, enc.payload, len(data), int(enc.method), None))
        entries.append(FileEntry.of(path, "blob", len(data), chunks=(oid,), executable=path.endswith("commit")))
    name, pack, index = pack_bytes(objects)
    tree = Tree(tuple(entries), 4 << 20)
    commit = Commit(tree.id, (parent,) if parent else (), "mallory", 1, "update", {})
    out = {"wvc.json": b'{"format": 1}', tree_path(tree.id): tree.to_bytes(), commit_path(commit.id): commit.to_bytes(),
           "refs/heads/main": (commit.id + "\n").encode(), pack_path(name): pack,
           pack_path(name, "idx"): json.dumps([e.to_json() for e in index]).encode()}
    for path, data in out.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)
    return commit.id


@pytest.mark.parametrize("name", [".git", ".GIT", ".Git.", ".git ", ".g\u200cit", "\ufeff.git", "GIT~1", "git~2",
                                  ".git::$INDEX_ALLOCATION", ".wvc", ".WVC", "WVC~1"])
def test_every_spelling_of_git_and_wvc_is_refused_in_a_path(name):
    assert reserved_name(name) in (".git", ".wvc")
    for path in (f"{name}/config", f"sub/{name}/hooks/post-checkout", name):
        with pytest.raises(UnsafePath):
            validate_relpath(path)


@pytest.mark.parametrize("name", [".gitignore", ".gitattributes", "git", "digit~1", ".github", "git~", "x.git"])
def test_names_that_only_look_alike_are_allowed(name):
    assert reserved_name(name) is None
    validate_relpath(f"a/{name}")


@pytest.mark.parametrize("path", [".git/config", ".git/hooks/post-checkout", "sub/.GIT/config", "GIT~1/config",
                                  ".g\u200dit/hooks/pre-commit"])
def test_clone_of_a_remote_with_a_git_entry_is_refused_and_leaves_nothing(tmp_path, path):
    remote = tmp_path / "remote"
    hostile_remote(remote, {"model.bin": b"weights", path: FSMONITOR})
    r = run(tmp_path, "clone", remote, "victim", check=False)
    assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
    assert ".git" in r.stderr
    assert not (tmp_path / "victim").exists()
    r = run(tmp_path, "clone", "--lazy", remote, "lazy", check=False)
    assert r.returncode != 0 and not (tmp_path / "lazy").exists()


def test_pull_into_a_git_checkout_never_touches_its_git_directory(tmp_path):
    remote = tmp_path / "remote"
    first = hostile_remote(remote, {"model.bin": b"weights v1"})
    victim = clone(str(remote), tmp_path / "victim")
    git_dir = victim.root / ".git"
    (git_dir / "hooks").mkdir(parents=True)
    (git_dir / "config").write_bytes(b"[core]\n\tbare = false\n")
    before = tree_digests_all(git_dir)
    hostile_remote(remote, {"model.bin": b"weights v2", ".git/config": FSMONITOR, ".git/hooks/post-commit": HOOK},
                   parent=first)
    r = run(victim.root, "pull", check=False)
    assert r.returncode != 0 and ".git" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert tree_digests_all(git_dir) == before
    assert (victim.root / "model.bin").read_bytes() == b"weights v1"
    assert not (git_dir / "hooks" / "post-commit").exists()


def tree_digests_all(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_commit_never_records_a_git_directory_and_refuses_a_wvcignore_that_asks_it_to(tmp_path):
    root = tmp_path / "m"
    (root / ".git" / "hooks").mkdir(parents=True)
    (root / ".git" / "config").write_text("[core]\n")
    (root / "sub" / ".GIT").mkdir(parents=True)
    (root / "sub" / ".GIT" / "config").write_text("x")
    (root / "model.bin").write_bytes(b"w")
    repo = Repo.init(root)
    repo.commit("one")
    assert [f.path for f in repo.tree_of("HEAD").files] == ["model.bin"]
    (root / ".wvcignore").write_text("*.tmp\n!.git/\n")
    r = run(root, "commit", "-m", "two", check=False)
    assert r.returncode != 0 and ".wvcignore line 2" in r.stderr and "'!.git/'" in r.stderr, r.stderr


def test_a_tree_with_names_that_fold_together_is_refused_from_a_remote(tmp_path):
    for i, (a, b) in enumerate([("Config.json", "config.json"), ("caf\u00e9.txt", "cafe\u0301.txt"),
                                ("Weights", "weights/x.bin")]):
        remote = tmp_path / f"remote{i}"
        hostile_remote(remote, {a: b"first", b: b"second"})
        r = run(tmp_path, "clone", remote, f"victim{i}", check=False)
        assert r.returncode != 0 and "one name on case-insensitive" in r.stderr, r.stderr
        assert not (tmp_path / f"victim{i}").exists()


def test_commit_refuses_names_that_fold_together_naming_both(tmp_path):
    root = tmp_path / "m"
    root.mkdir()
    (root / "Config.json").write_text("a")
    (root / "config.json").write_text("b")
    run(root, "init")
    r = run(root, "commit", "-m", "one", check=False)
    assert r.returncode != 0 and "Config.json" in r.stderr and "config.json" in r.stderr, r.stderr
    with pytest.raises(FormatError):
        Tree.from_bytes(Tree((FileEntry.of("A", "blob", 0, chunks=()), FileEntry.of("a", "blob", 0, chunks=())),
                             4 << 20).to_bytes())
