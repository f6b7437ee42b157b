"""Everyday workflows lose nothing (issue: modes, symlinked snapshots, names, rebase, undo, tags).

One test (or a few) per numbered finding; each failed before its fix.
"""

import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from wvc import Repo, clone
from wvc.errors import UncommittedChanges, WvcError

from .conftest import repo_state, tree_digests

WVC = [sys.executable, "-m", "wvc"]


def run(cwd, *args, env=None, check=True):
    r = subprocess.run(WVC + [str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=120,
                       env={**os.environ, **(env or {})})
    if check:
        assert r.returncode == 0, r.stderr
    return r


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def two_tensors(path, x_seed=0, y_seed=1):
    gx, gy = torch.Generator().manual_seed(x_seed), torch.Generator().manual_seed(y_seed)
    save_file({"x": torch.randn(256, generator=gx).to(torch.bfloat16),
               "y": torch.randn(256, generator=gy).to(torch.bfloat16)}, str(path))


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


# -- 1. modes -------------------------------------------------------------------------------------
def test_modes_round_trip_through_commit_checkout_clone_and_a_directory_remote(tmp_path, umask_022):
    repo = Repo.init(tmp_path / "m")
    script, config = repo.root / "train.sh", repo.root / "config.json"
    script.write_text("#!/bin/sh\necho train\n")
    script.chmod(0o755)
    config.write_text("{}")
    config.chmod(0o644)
    first = repo.commit("v1").commit
    assert {f.path: f.executable for f in repo.tree_of("HEAD").files} == {"config.json": False, "train.sh": True}
    remote = tmp_path / "shared"
    repo.remote_add("team", str(remote))
    repo.push("team")
    script.chmod(0o644)  # losing the x bit is a change, as in git
    assert repo.status().modified == ["train.sh"]
    repo.commit("not executable")
    repo.checkout(first)
    assert mode(script) == 0o755 and mode(config) == 0o644
    out = tmp_path / "out"
    repo.checkout(first, output=out)
    assert mode(out / "train.sh") == 0o755 and mode(out / "config.json") == 0o644
    for p in remote.rglob("*"):  # teammates (group, others) can read every file the push wrote
        if p.is_file():
            assert mode(p) & 0o044 == 0o044, (p, oct(mode(p)))
        else:
            assert mode(p) & 0o055 == 0o055, (p, oct(mode(p)))
    for p in (repo.root / ".wvc" / "packs").iterdir():
        assert mode(p) == 0o644, p
    other = clone(str(remote), tmp_path / "c")
    other.checkout(first)
    assert mode(other.root / "train.sh") == 0o755 and mode(other.root / "config.json") == 0o644


def test_a_directory_remote_is_readable_by_another_user(tmp_path, umask_022):
    if os.geteuid() != 0:
        pytest.skip("needs root to act as another user")
    import shutil
    import tempfile

    repo = Repo.init(tmp_path / "m")
    (repo.root / "w.bin").write_bytes(os.urandom(5000))
    repo.commit("v1")
    team = Path(tempfile.mkdtemp(prefix="wvc-team-", dir="/tmp"))  # pytest's tmp is private to root
    try:
        team.chmod(0o755)
        remote = team / "shared"
        repo.remote_add("team", str(remote))
        repo.push("team")
        files = [p for p in remote.rglob("*") if p.is_file()]
        r = subprocess.run(["cat", *map(str, files)], user="nobody", capture_output=True)
        assert r.returncode == 0, r.stderr
        assert len(r.stdout) == sum(p.stat().st_size for p in files)
    finally:
        shutil.rmtree(team)


# -- 2. symlinks ----------------------------------------------------------------------------------
def snapshot_download_layout(cache: Path) -> Path:
    """huggingface_hub's cache: snapshots/<rev>/<file> are symlinks into ../../blobs/<hash>."""
    blobs, snap = cache / "blobs", cache / "snapshots" / "abc123"
    blobs.mkdir(parents=True)
    (snap / "sub").mkdir(parents=True)
    files = {"model.safetensors": None, "config.json": b'{"hidden": 8}', "sub/tokenizer.json": b"{}" * 1000}
    tmp = cache / "tmp.safetensors"
    save_file({"w": torch.randn(64, 64).to(torch.bfloat16)}, str(tmp))
    files["model.safetensors"] = tmp.read_bytes()
    tmp.unlink()
    for name, data in files.items():
        blob = blobs / f"blob{len(list(blobs.iterdir()))}"
        blob.write_bytes(data)
        link = snap / name
        link.symlink_to(os.path.relpath(blob, link.parent))
    return snap


def test_a_snapshot_download_directory_commits_whole_and_checks_out_as_regular_files(tmp_path):
    snap = snapshot_download_layout(tmp_path / "models--org--m")
    expected = tree_digests(snap)
    assert len(expected) == 3
    run(snap, "init")
    r = run(snap, "commit", "-m", "from the hub cache")
    assert "3 symlinked files committed as their content" in r.stdout
    out = tmp_path / "out"
    run(snap, "checkout", "HEAD", "--output", out)
    assert tree_digests(out) == expected
    assert not any(p.is_symlink() for p in out.rglob("*"))
    assert json.loads(run(snap, "status", "--json").stdout)["clean"]


def test_dangling_and_directory_symlinks_are_reported_by_commit(tmp_path):
    repo = Repo.init(tmp_path / "m")
    (repo.root / "w.bin").write_bytes(b"w")
    (repo.root / "gone").symlink_to(tmp_path / "nothing")
    (repo.root / "dir").symlink_to(tmp_path)
    r = run(repo.root, "commit", "-m", "c")
    assert "skipped symlink (dangling or to a directory): dir" in r.stdout
    assert "skipped symlink (dangling or to a directory): gone" in r.stdout


# -- 3. names -------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["logs\\run1.txt", "tab\there.txt", "new\nline.txt", "del\x7f.txt"])
def test_a_name_no_tree_can_hold_is_refused_at_commit_in_one_line(tmp_path, name):
    repo = Repo.init(tmp_path / "m")
    (repo.root / "ok.txt").write_text("ok")
    repo.commit("first")
    (repo.root / name).write_text("x")
    before = repo_state(repo.root)
    r = run(repo.root, "commit", "-m", "bad", check=False)
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert repr(name) in r.stderr and ("backslash" in r.stderr or "control" in r.stderr)
    assert repo_state(repo.root) == before  # nothing committed
    st = json.loads(run(repo.root, "status", "--json").stdout)
    assert [b["path"] for b in st["bad_names"]] == [name]
    (repo.root / name).unlink()
    assert run(repo.root, "fsck").returncode == 0  # the repository stays readable throughout


def test_dot_wvc_is_reserved_at_any_depth_and_a_nested_repository_is_skipped(tmp_path):
    repo = Repo.init(tmp_path / "m")
    (repo.root / "w.bin").write_text("w")
    (repo.root / ".WVC").mkdir()
    (repo.root / ".WVC" / "x").write_text("x")
    nested = Repo.init(repo.root / "experiments" / "other")
    (nested.root / "n.bin").write_text("n")
    (repo.root / "experiments" / "notes.txt").write_text("notes")
    res = repo.commit("c")
    assert [f.path for f in repo.tree_of("HEAD").files] == ["experiments/notes.txt", "w.bin"]
    assert res.nested_repositories == ["experiments/other"]
    assert repo.status().nested_repositories == ["experiments/other"]
    assert repo.fsck().ok


# -- 4. header and data of one version --------------------------------------------------------------
def test_a_file_replaced_between_header_and_data_is_committed_as_one_version(tmp_path, monkeypatch):
    repo = Repo.init(tmp_path / "m")
    path = repo.root / "model.safetensors"
    save_file({"w": torch.zeros(512, dtype=torch.float16)}, str(path))
    replacement = tmp_path / "new.safetensors"
    save_file({"w": torch.ones(512, dtype=torch.bfloat16)}, str(replacement))
    assert replacement.stat().st_size == path.stat().st_size  # same size: only the bytes tell
    import wvc.worktree.chunking as chunking

    real, calls = chunking.st.read_header, []

    def read_then_replace(*a, **k):
        header = real(*a, **k)
        if not calls:  # after the first (validation) read, the file is atomically replaced
            os.replace(replacement, path)
        calls.append(1)
        return header

    monkeypatch.setattr(chunking.st, "read_header", read_then_replace)
    new_bytes = Path(str(replacement)).read_bytes() if replacement.exists() else None
    repo.commit("c")
    out = tmp_path / "out"
    repo.checkout("HEAD", output=out)
    assert (out / "model.safetensors").read_bytes() == new_bytes  # the new file, whole


# -- 5. file <-> directory ----------------------------------------------------------------------------
def test_checkout_crosses_a_file_directory_change_both_ways(tmp_path):
    repo = Repo.init(tmp_path / "m")
    (repo.root / "a").mkdir()
    (repo.root / "a" / "b").write_text("inside")
    (repo.root / "0.txt").write_text("sorts first")
    as_dir = repo.commit("a is a directory").commit
    digests_dir = tree_digests(repo.root)
    (repo.root / "a" / "b").unlink()
    (repo.root / "a").rmdir()
    (repo.root / "a").write_text("now a file")
    (repo.root / "0.txt").write_text("changed too")
    as_file = repo.commit("a is a file").commit
    digests_file = tree_digests(repo.root)
    repo.checkout(as_dir)
    assert tree_digests(repo.root) == digests_dir
    repo.checkout(as_file)
    assert tree_digests(repo.root) == digests_file


def test_untracked_work_in_the_way_is_refused_before_anything_changes(tmp_path):
    repo = Repo.init(tmp_path / "m")
    (repo.root / "0.txt").write_text("v1")
    (repo.root / "a").write_text("file")
    as_file = repo.commit("file").commit
    (repo.root / "a").unlink()
    (repo.root / "0.txt").write_text("v2")
    repo.commit("no a")
    (repo.root / "a").mkdir()
    (repo.root / "a" / "mine.txt").write_text("untracked work")
    before = tree_digests(repo.root)
    with pytest.raises(UncommittedChanges, match="a/"):
        repo.checkout(as_file)
    assert tree_digests(repo.root) == before  # 0.txt (sorting first) was not switched
    assert repo.log()[0].message == "no a"


def test_pull_crosses_a_file_directory_change(tmp_path):
    a = Repo.init(tmp_path / "a")
    (a.root / "a").write_text("file")
    a.commit("file")
    a.remote_add("origin", str(tmp_path / "r"))
    a.push()
    b = clone(str(tmp_path / "r"), tmp_path / "b")
    (a.root / "a").unlink()
    (a.root / "a").mkdir()
    (a.root / "a" / "b").write_text("dir")
    a.commit("dir")
    a.push()
    b.pull()
    assert tree_digests(b.root) == tree_digests(a.root)


def test_a_checkout_that_fails_midway_keeps_head_and_a_rerun_finishes_it(tmp_path, monkeypatch):
    repo = Repo.init(tmp_path / "m")
    for name in "abc":
        (repo.root / f"{name}.bin").write_text(f"{name} v1")
    v1 = repo.commit("v1").commit
    digests_v1 = tree_digests(repo.root)
    for name in "abc":
        (repo.root / f"{name}.bin").write_text(f"{name} v2")
    repo.commit("v2")
    import wvc.ops.checkout as co

    real, calls = co.write_file, []

    def fail_second(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise OSError(5, "Input/output error")
        return real(*a, **k)

    monkeypatch.setattr(co, "write_file", fail_second)
    with pytest.raises(OSError):
        repo.checkout(v1)
    assert repo.log()[0].message == "v2" and repo.head_branch() == "main"  # HEAD did not move
    monkeypatch.undo()
    repo.checkout(v1)  # no --force needed: what the failed run wrote is the target's
    assert tree_digests(repo.root) == digests_v1 and repo.status().clean


# -- 6. working-tree lock ---------------------------------------------------------------------------
def test_a_commit_waits_for_the_working_tree_lock_and_says_who_holds_it(repo):
    (repo.root / "w.bin").write_text("w")
    with repo.internals.worktree_lock("checkout"):
        r = run(repo.root, "commit", "-m", "c", env={"WVC_LOCK_TIMEOUT": "0.3"}, check=False)
    assert r.returncode == 1 and "locked by wvc checkout (pid" in r.stderr and r.stderr.count("\n") == 1
    run(repo.root, "commit", "-m", "c")


def test_a_commit_during_a_checkout_cannot_record_a_mix_of_versions(tmp_path, monkeypatch):
    repo = Repo.init(tmp_path / "m")
    for name in "abc":
        (repo.root / f"{name}.bin").write_text(f"{name} v1")
    v1 = repo.commit("v1").commit
    for name in "abc":
        (repo.root / f"{name}.bin").write_text(f"{name} v2")
    repo.commit("v2")
    import wvc.ops.checkout as co

    real, tried = co.write_file, []

    def write_then_commit_elsewhere(*a, **k):
        out = real(*a, **k)
        if not tried:  # another process commits while this checkout is half done
            tried.append(run(repo.root, "commit", "-m", "racing", env={"WVC_LOCK_TIMEOUT": "0.2"}, check=False))
        return out

    monkeypatch.setattr(co, "write_file", write_then_commit_elsewhere)
    repo.checkout(v1)
    assert tried[0].returncode == 1 and "locked" in tried[0].stderr
    assert [e.message for e in repo.log("main")] == ["v2", "v1"]


# -- 7. pull --rebase ---------------------------------------------------------------------------------
def _two_clones(tmp_path):
    a = Repo.init(tmp_path / "a")
    two_tensors(a.root / "model.safetensors")
    (a.root / "a.txt").write_text("a0")
    (a.root / ".wvcignore").write_text("*.log\n")
    a.commit("base")
    a.remote_add("origin", str(tmp_path / "r"))
    a.push()
    return a, clone(str(tmp_path / "r"), tmp_path / "b")


def test_pull_rebase_keeps_both_sides_changes_to_different_files_and_tensors(tmp_path):
    a, b = _two_clones(tmp_path)
    (a.root / "a.txt").write_text("a1")
    (a.root / ".wvcignore").write_text("*.log\n*.tmp\n")
    two_tensors(a.root / "model.safetensors", x_seed=5)  # a trains x
    a.commit("a's change")
    a.push()
    two_tensors(b.root / "model.safetensors", y_seed=6)  # b trains y
    (b.root / "b.txt").write_text("b1")
    b.commit("b's change")
    r = run(b.root, "pull", "--rebase")
    assert "Rebased 1 commit of main onto origin/main" in r.stdout, r.stdout
    b.push()
    final = clone(str(tmp_path / "r"), tmp_path / "final")
    assert (final.root / "a.txt").read_text() == "a1" and (final.root / "b.txt").read_text() == "b1"
    assert (final.root / ".wvcignore").read_text() == "*.log\n*.tmp\n"
    from safetensors.torch import load_file

    got = load_file(str(final.root / "model.safetensors"))
    gx, gy = torch.Generator().manual_seed(5), torch.Generator().manual_seed(6)
    assert torch.equal(got["x"], torch.randn(256, generator=gx).to(torch.bfloat16))
    assert torch.equal(got["y"], torch.randn(256, generator=gy).to(torch.bfloat16))
    assert tree_digests(b.root) == tree_digests(final.root)


def test_pull_rebase_of_the_same_tensor_is_refused_and_loses_nothing(tmp_path):
    a, b = _two_clones(tmp_path)
    two_tensors(a.root / "model.safetensors", x_seed=5)
    a.commit("a trains x")
    a.push()
    two_tensors(b.root / "model.safetensors", x_seed=6)
    mine = b.commit("b trains x too").commit
    b.fetch()
    before = repo_state(b.root)
    r = run(b.root, "pull", "--rebase", check=False)
    assert r.returncode == 1 and "model.safetensors:x" in r.stderr
    assert repo_state(b.root) == before and b.log()[0].id == mine


# -- 8. a way back --------------------------------------------------------------------------------------
def test_reset_amend_restore_and_reflog_recovery_with_json(tmp_path):
    root = tmp_path / "m"
    run(tmp_path, "init", root)
    (root / "w.txt").write_text("1")
    run(root, "commit", "-m", "one")
    (root / "w.txt").write_text("2")
    run(root, "commit", "-m", "two")
    # a commit left behind by a checkout of another branch: made on a detached HEAD
    run(root, "checkout", "HEAD~1")
    (root / "w.txt").write_text("lost?")
    lost = json.loads(run(root, "commit", "-m", "on a detached HEAD", "--json").stdout)["commit"]
    run(root, "checkout", "main")
    log = json.loads(run(root, "reflog", "--json").stdout)["entries"]
    assert log[1]["new"] == lost and log[1]["selector"] == "HEAD@{1}"
    rescued = json.loads(run(root, "branch", "rescue", "HEAD@{1}", "--json").stdout)
    assert rescued["commit"] == lost
    gc = json.loads(run(root, "gc", "--grace", "0", "--json").stdout)
    assert gc["commits_removed"] == 0

    res = json.loads(run(root, "reset", "--hard", "HEAD~1", "--json").stdout)
    assert res["mode"] == "hard" and (root / "w.txt").read_text() == "1"
    back = json.loads(run(root, "reset", "--hard", "main@{1}", "--json").stdout)
    assert (root / "w.txt").read_text() == "2" and back["new"] == res["old"]
    soft = json.loads(run(root, "reset", "--soft", "HEAD~1", "--json").stdout)
    assert (root / "w.txt").read_text() == "2" and soft["written"] == 0
    assert json.loads(run(root, "status", "--json").stdout)["modified"] == ["w.txt"]
    amended = json.loads(run(root, "commit", "--amend", "-m", "one, amended", "--json").stdout)
    assert amended["parents"] == [] and (root / "w.txt").read_text() == "2"
    assert [c["message"] for c in json.loads(run(root, "log", "--json").stdout)["commits"]] == ["one, amended"]
    (root / "w.txt").write_text("local edit")
    restored = json.loads(run(root, "checkout", "--json", "rescue", "--", "w.txt").stdout)
    assert restored["restored"] == ["w.txt"] and (root / "w.txt").read_text() == "lost?"
    assert json.loads(run(root, "status", "--json").stdout)["modified"] == ["w.txt"]  # HEAD did not move


def test_branch_delete_refuses_an_unmerged_branch_and_force_moves(tmp_path):
    repo = Repo.init(tmp_path / "m")
    (repo.root / "w.txt").write_text("1")
    repo.commit("one")
    repo.create_branch("exp")
    repo.checkout("exp")
    (repo.root / "w.txt").write_text("exp")
    exp = repo.commit("exp work").commit
    repo.checkout("main")
    with pytest.raises(WvcError, match="not merged"):
        repo.delete_branch("exp")
    assert repo.branches()["exp"] == exp
    old, new = repo.force_branch("exp", "main")
    assert old == exp and new == repo.resolve("main")
    assert repo.resolve("exp@{1}") == exp  # the reflog remembers where it was
    with pytest.raises(WvcError, match="checked out"):
        repo.force_branch("main", "exp@{1}")
    repo.force_branch("exp", "exp@{1}")
    assert repo.delete_branch("exp", force=True) == exp


def test_gc_says_what_it_kept_and_why(tmp_path):
    root = tmp_path / "m"
    run(tmp_path, "init", root)
    (root / "w.txt").write_text("1")
    run(root, "commit", "-m", "one")
    (root / "w.txt").write_text("2")
    run(root, "commit", "-m", "two")
    run(root, "reset", "--hard", "HEAD~1")
    out = run(root, "gc").stdout
    assert "Removed 0 commits" in out and "Kept 1 commit no branch or tag reaches: the reflog names them" in out


# -- 9. tags, log --all, log on an empty branch, wvc.open REV grammar --------------------------------------
def test_tags_are_pushed_fetched_and_cloned(tmp_path):
    repo = Repo.init(tmp_path / "m")
    (repo.root / "w.txt").write_text("1")
    v1 = repo.commit("one").commit
    repo.create_tag("v1")
    remote = tmp_path / "nfs"
    run(repo.root, "remote", "add", "nfs", remote)
    run(repo.root, "push", "nfs", "v1")  # a tag name pushes the tag
    (repo.root / "w.txt").write_text("2")
    repo.commit("two")
    repo.create_tag("v2")
    run(repo.root, "push", "nfs", "main")
    r = run(repo.root, "push", "nfs", "--tags")
    assert "v2" in r.stdout
    other = clone(str(remote), tmp_path / "c")
    assert other.tags() == repo.tags()
    repo.create_tag("v3", "HEAD~1")
    files = sorted(p.name for p in remote.rglob("*") if p.is_file() and "refs" not in p.parts)
    run(repo.root, "push", "nfs", "--tags")
    assert sorted(p.name for p in remote.rglob("*") if p.is_file() and "refs" not in p.parts) == files  # refs only
    fetched = other.fetch()
    assert fetched.tags == {"v3": v1} and other.tags() == repo.tags()
    assert run(repo.root, "tag", "-a", "x", check=False).returncode == 2  # no option that does nothing


def test_log_all_shows_remote_tracking_refs_and_an_empty_branch_names_the_others(tmp_path):
    a = Repo.init(tmp_path / "a")
    (a.root / "w.txt").write_text("1")
    a.commit("one")
    a.remote_add("origin", str(tmp_path / "r"))
    a.push()
    b = clone(str(tmp_path / "r"), tmp_path / "b")
    (a.root / "w.txt").write_text("2")
    a.commit("two")
    a.push()
    b.fetch()
    r = run(b.root, "log", "--graph", "--all", "--oneline")
    assert "two" in r.stdout and "origin/main" in r.stdout

    c = Repo.init(tmp_path / "c")
    c.commit("from memory", source={"w": torch.zeros(2)}, branch="run/exp1")
    r = run(c.root, "log")
    assert "main has no commits yet" in r.stderr and "run/exp1" in r.stderr


def test_wvc_open_takes_the_whole_rev_grammar_on_a_remote(tmp_path):
    import wvc

    repo = Repo.init(tmp_path / "m")
    ids = []
    for i in range(4):
        (repo.root / "w.txt").write_text(str(i))
        ids.append(repo.commit(f"c{i}").commit)
    repo.remote_add("origin", str(tmp_path / "r"))
    repo.push()
    url = "file://" + str(tmp_path / "r")
    assert wvc.open(url, "main~3").commit == ids[0]
    assert wvc.open(url, ids[1][:10]).commit == ids[1]
    assert wvc.open(url, f"{ids[3][:8]}^").read_file("w.txt") == b"2"


# -- 10. metadata ---------------------------------------------------------------------------------------
def test_meta_values_keep_strings_and_take_exact_literals(tmp_path):
    root = tmp_path / "m"
    run(tmp_path, "init", root)
    (root / "w.txt").write_text("1")
    run(root, "commit", "-m", "c", "--meta", "git=8417e93", "--meta", "step=200", "--meta", "lr=1e-5",
        "--meta", "v=NaN", "--meta", "ok=true", "--meta", "n=007", "--meta-json", 'cfg={"layers": [1, 2]}')
    meta = json.loads(run(root, "show", "--json").stdout)["metadata"]
    assert meta == {"git": "8417e93", "step": 200, "lr": 1e-5, "v": "NaN", "ok": True, "n": "007",
                    "cfg": {"layers": [1, 2]}}
    r = run(root, "commit", "-m", "c", "--allow-empty", "--meta-json", "x=NaN", check=False)
    assert r.returncode == 2 and "not JSON" in r.stderr


def test_trainer_metrics_that_are_not_finite_are_stored_not_raised():
    from types import SimpleNamespace

    from wvc.integrations.transformers import _latest_metrics

    state = SimpleNamespace(log_history=[{"loss": 1.0, "grad_norm": float("inf"), "step": 1},
                                         {"loss": float("nan"), "step": 2}])
    assert _latest_metrics(state) == {"loss": "nan", "grad_norm": "inf"}


# -- 11. relative directory remotes -------------------------------------------------------------------------
def test_a_relative_directory_remote_is_anchored_at_the_repository_root(tmp_path):
    root = tmp_path / "m"
    run(tmp_path, "init", root)
    (root / "sub").mkdir()
    (root / "sub" / "w.bin").write_bytes(os.urandom(1000))
    run(root, "commit", "-m", "c")
    run(root, "remote", "add", "rel", "../shared")
    run(root / "sub", "push", "rel")  # pushed from a subdirectory
    assert (tmp_path / "shared" / "wvc.json").is_file()
    assert not (root / "shared").exists() and not (root / "sub" / "shared").exists()


# -- 12. default ignores ---------------------------------------------------------------------------------
def test_git_and_hf_cache_folders_are_ignored_by_default_and_can_be_re_included(tmp_path):
    repo = Repo.init(tmp_path / "m")
    for rel in (".git/lfs/objects/ab/weights", ".cache/huggingface/download/x.lock", "sub/.git/HEAD", "w.bin"):
        (repo.root / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo.root / rel).write_text(rel)
    repo.commit("c")
    assert [f.path for f in repo.tree_of("HEAD").files] == ["w.bin"]
    (repo.root / ".wvcignore").write_text("!.cache/huggingface/\n")
    repo.commit("re-include")
    assert [f.path for f in repo.tree_of("HEAD").files] == [".cache/huggingface/download/x.lock", ".wvcignore",
                                                               "w.bin"]


# -- 13. interrupted operations ------------------------------------------------------------------------------
def test_an_init_killed_before_its_format_row_does_not_block_a_rerun(tmp_path):
    import sqlite3

    root = tmp_path / "m"
    (root / ".wvc" / "packs").mkdir(parents=True)
    sqlite3.connect(root / ".wvc" / "wvc.db").execute("CREATE TABLE config (key TEXT PRIMARY KEY, value TEXT)")
    r = run(root, "status", check=False)
    assert r.returncode == 1 and "interrupted `wvc init`" in r.stderr
    run(root, "init")
    assert run(root, "status").returncode == 0


def test_a_killed_init_leaves_nothing_half_made(tmp_path):
    script = textwrap.dedent(f"""
        import os, wvc.store.database as d
        real = d.Database.migrate
        def die(self):
            real(self)
            os._exit(9)
        d.Database.migrate = die
        import wvc
        wvc.Repo.init({str(tmp_path / 'm')!r})
    """)
    assert subprocess.run([sys.executable, "-c", script], timeout=60).returncode == 9
    assert not (tmp_path / "m" / ".wvc").exists()
    run(tmp_path, "init", tmp_path / "m")
    assert not [p for p in (tmp_path / "m").iterdir() if p.name != ".wvc"]


def test_a_killed_clone_can_be_run_again(tmp_path):
    repo = Repo.init(tmp_path / "m")
    (repo.root / "w.bin").write_bytes(os.urandom(2000))
    repo.commit("c")
    repo.remote_add("origin", str(tmp_path / "r"))
    repo.push()
    script = textwrap.dedent(f"""
        import os, wvc.ops.clone as c
        c.pull = lambda *a, **k: os._exit(9)
        import wvc
        wvc.clone({str(tmp_path / 'r')!r}, {str(tmp_path / 'c')!r})
    """)
    assert subprocess.run([sys.executable, "-c", script], timeout=60).returncode == 9
    assert (tmp_path / "c" / ".wvc").is_dir()
    run(tmp_path, "clone", tmp_path / "r", tmp_path / "c")
    assert tree_digests(tmp_path / "c") == tree_digests(repo.root)


def test_a_killed_push_leaves_a_work_dir_that_fsck_reports_and_the_next_push_removes(tmp_path):
    repo = Repo.init(tmp_path / "m")
    (repo.root / "w.bin").write_bytes(os.urandom(200_000))
    repo.commit("c")
    repo.remote_add("origin", str(tmp_path / "r"))
    script = textwrap.dedent(f"""
        import os, wvc.remotes.segment as p
        real = p.new_segment
        def die(*a, **k):
            real(*a, **k)
            os._exit(9)
        p.new_segment = die
        import wvc
        wvc.Repo.open({str(repo.root)!r}).push()
    """)
    assert subprocess.run([sys.executable, "-c", script], timeout=60).returncode == 9
    left = [p for p in (repo.root / ".wvc").iterdir() if p.name.startswith("wvc-work-push-")]
    assert len(left) == 1 and any(left[0].rglob("*.pack"))
    r = run(repo.root, "fsck")
    assert f"leftover (gc removes it): .wvc/{left[0].name}" in r.stdout
    repo.push()
    assert not left[0].exists()


def test_a_full_disk_removes_the_temp_pack_and_says_no_space(tmp_path, monkeypatch):
    import errno

    import wvc.store.packs as packs

    repo = Repo.init(tmp_path / "m")
    (repo.root / "w.bin").write_bytes(os.urandom(100_000))
    real_add = packs.PackWriter.add

    def full(self, *a, **k):
        def fail(*_):
            raise OSError(errno.ENOSPC, "No space left on device")
        self.fh.fh.close = fail  # the close after a full disk fails too (its flush)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(packs.PackWriter, "add", full)
    with pytest.raises(OSError):
        repo.commit("c")
    assert not [p for p in (repo.root / ".wvc" / "packs").iterdir()]
    monkeypatch.setattr(packs.PackWriter, "add", real_add)
    script = textwrap.dedent("""
        import errno, sys, wvc.store.packs as p
        def full(self, *a, **k):
            raise OSError(errno.ENOSPC, "No space left on device")
        p.PackWriter.add = full
        from wvc.cli import main
        sys.argv = ["wvc", "commit", "-m", "c"]
        main()
    """)
    r = subprocess.run([sys.executable, "-c", script], cwd=repo.root, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "no space left on device" in r.stderr and "damaged" not in r.stderr


def test_gc_leaves_a_nested_repositorys_temp_files_alone(tmp_path):
    repo = Repo.init(tmp_path / "m")
    (repo.root / "w.txt").write_text("w")
    repo.commit("c")
    nested = Repo.init(repo.root / "inner")
    theirs = nested.root / ".wvc-tmp-in-progress"
    theirs.write_text("another repository's write")
    ours = repo.root / ".wvc-tmp-leftover"
    ours.write_text("ours")
    repo.gc(grace_seconds=0)
    assert theirs.exists() and not ours.exists()


# -- 14. output --------------------------------------------------------------------------------------------
def test_commit_and_push_ratios_are_honest_and_counts_singular(tmp_path):
    root = tmp_path / "m"
    run(tmp_path, "init", root)
    (root / "tiny.txt").write_text("x" * 20)
    out = run(root, "commit", "-m", "tiny").stdout
    assert "x smaller" not in out and "the size of the files" in out
    run(root, "remote", "add", "r", tmp_path / "r")
    out = run(root, "push", "r").stdout
    assert ": 1 commit," in out and "less than a full upload" not in out


def test_diff_names_dtype_changes_and_marks_cut_names(tmp_path):
    repo = Repo.init(tmp_path / "m")
    long = "model.layers.0.self_attn.q_proj.lora_A.default.weight_long_name"
    save_file({"w": torch.ones(8), long: torch.zeros(4)}, str(repo.root / "model.safetensors"))
    repo.commit("fp32")
    save_file({"w": torch.ones(8, dtype=torch.bfloat16), long: torch.ones(4)}, str(repo.root / "model.safetensors"))
    repo.commit("bf16")
    r = run(repo.root, "diff", "HEAD~1", "HEAD")
    line = next(l for l in r.stdout.splitlines() if l.startswith("w "))
    assert "retyped" in line and "F32" in line and "BF16" in line, r.stdout
    assert long[:45] + "..." in r.stdout and long not in r.stdout


def test_diff_reports_progress(repo):
    from wvc.progress import Progress

    save_file({"w": torch.zeros(4096)}, str(repo.root / "model.safetensors"))
    repo.commit("a")
    save_file({"w": torch.ones(4096)}, str(repo.root / "model.safetensors"))

    class Recorder(Progress):
        def __init__(self):
            self.total, self.done = 0, 0

        def start(self, total, label):
            self.total = total

        def advance(self, n):
            self.done += n

    rec = Recorder()
    repo.diff(progress=rec)
    assert rec.total > 0 and rec.done >= 4096 * 4


def test_cat_of_a_missing_file_and_a_base_without_scheme_say_what_to_do(tmp_path):
    root = tmp_path / "m"
    run(tmp_path, "init", root)
    (root / "a.txt").write_text("a")
    run(root, "commit", "-m", "c")
    r = run(root, "cat", "main:nonexist.json", check=False)
    assert r.returncode == 1 and r.stderr.strip() == "wvc: error: no file 'nonexist.json' in version " + \
        json.loads(run(root, "show", "--json").stdout)["commit"][:12]
    r = run(tmp_path, "init", tmp_path / "b", "--base", "org/base", check=False)
    assert r.returncode == 1 and "hf://org/base" in r.stderr


def test_hub_model_card_links_to_no_page_that_is_not_wvc():
    from wvc.remotes.hub import model_card

    card = model_card("team/model", {"refs/heads/main": "a" * 64})
    # the PyPI project named wvc is not this one (issue 37, finding 11)
    assert "](https://github.com/)" not in card and "pypi.org" not in card and "pip install wvc" not in card


def test_the_readme_snippet_state_dict_then_checkout_leaves_no_stale_file(tmp_path):
    repo = Repo.init(tmp_path / "m")
    save_file({"w": torch.zeros(64)}, str(repo.root / "model.safetensors"))
    repo.commit("step 100")
    repo.commit("from memory", source={"w": torch.ones(64)})
    repo.checkout("main")
    from safetensors.torch import load_file

    assert torch.equal(load_file(str(repo.root / "model.safetensors"))["w"], torch.ones(64))
    assert repo.status().clean
    with pytest.raises(WvcError, match="nothing to commit"):
        repo.commit("would revert")
