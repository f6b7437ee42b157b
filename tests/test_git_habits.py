"""Git and Python habits (issue 37, findings 13, 14 and 15): the commands a git user types
work, merges draw their fork line, and messages read as English."""

import json

import pytest

from .test_everyday import run


@pytest.fixture
def history(tmp_path):
    root = tmp_path / "m"
    (root / "sub").mkdir(parents=True)
    (root / "config.json").write_text('{"a": 1}\n')
    (root / "sub" / "t.txt").write_text("x\n")
    run(root, "init")
    ids = [json.loads(run(root, "commit", "-m", "one", "--json").stdout)["commit"]]
    (root / "config.json").write_text('{"a": 2}\n')
    ids.append(json.loads(run(root, "commit", "-m", "two", "--json").stdout)["commit"])
    (root / "sub" / "t.txt").write_text("y\n")
    ids.append(json.loads(run(root, "commit", "-m", "three", "--json").stdout)["commit"])
    return root, ids


def _log(root, *args):
    return [c["commit"] for c in json.loads(run(root, "log", "--json", *args).stdout)["commits"]]


def test_log_counts_ranges_exclusions_and_paths(history):
    root, (one, two, three) = history
    assert _log(root, "-2") == [three, two]
    assert _log(root, "HEAD~2..HEAD") == [three, two]
    assert _log(root, "main", f"^{two}") == [three]
    assert _log(root, "--", "config.json") == [two, one]
    assert _log(root / "sub", "--", "t.txt") == [three, one]  # paths from the current directory
    stat = json.loads(run(root, "log", "--json", "--stat", "-1").stdout)["commits"][0]["files"]
    assert stat == [{"path": "sub/t.txt", "status": "modified", "size_a": 2, "size_b": 2}]
    out = run(root, "show", "--stat", "HEAD~1").stdout
    assert "modified config.json" in out and "1 file changed" in out
    r = run(root, "show", "HEAD:config.json", check=False)
    assert r.returncode == 2 and "wvc cat HEAD:config.json" in r.stderr


def test_diff_name_only_paths_and_a_text_diff(history):
    root, _ = history
    (root / "config.json").write_text('{"a": 3}\n')
    (root / "sub" / "t.txt").write_text("z\n")
    assert run(root, "diff", "--name-only").stdout.split() == ["config.json", "sub/t.txt"]
    out = run(root, "diff", "--", "config.json").stdout
    assert "sub/t.txt" not in out and '-{"a": 2}' in out and '+{"a": 3}' in out
    assert json.loads(run(root, "diff", "HEAD~2", "HEAD", "--name-only", "--json").stdout)["files"] == \
        ["config.json", "sub/t.txt"]


def test_switch_checkout_b_restore_and_branch_rename(history):
    root, (one, two, three) = history
    (root / "config.json").write_text("edited\n")
    assert run(root, "status", "-s").stdout == " M config.json\n"
    run(root, "restore", "config.json")
    assert (root / "config.json").read_text() == '{"a": 2}\n'
    (root / "sub" / "t.txt").write_text("edited\n")
    run(root / "sub", "checkout", "--", "t.txt")  # git's "discard my edit"
    assert (root / "sub" / "t.txt").read_text() == "y\n"
    run(root, "checkout", "-b", "exp", "HEAD~1")
    assert run(root, "branch", "--show-current").stdout.strip() == "exp"
    assert (root / "sub" / "t.txt").read_text() == "x\n"
    run(root, "branch", "-m", "exp", "exp2")
    assert run(root, "branch", "--show-current").stdout.strip() == "exp2"
    run(root, "switch", "main")
    assert (root / "sub" / "t.txt").read_text() == "y\n"
    run(root, "switch", "-c", "other")
    assert run(root, "branch", "--show-current").stdout.strip() == "other"
    r = run(root, "switch", "nope", check=False)
    assert r.returncode == 2 and "switch -c nope" in r.stderr
    assert run(root, "-C", root / "sub", "status", "-s").stdout == ""
    assert _log(root / "sub", "-1") == [three]


def test_remote_listing_rename_and_set_url(history, tmp_path):
    root, _ = history
    run(root, "remote", "add", "o", tmp_path / "r1")
    assert run(root, "remote").stdout == "o\n"
    assert f"o\t{tmp_path / 'r1'} (fetch)" in run(root, "remote", "-v").stdout
    run(root, "push", "o")
    run(root, "remote", "rename", "o", "p")
    assert json.loads(run(root, "branch", "-a", "--json").stdout)["remote"] == {"p/main": _log(root, "-1")[0]}
    out = json.loads(run(root, "remote", "set-url", "p", tmp_path / "r2", "--json").stdout)
    assert out["url"] == str(tmp_path / "r2")
    assert json.loads(run(root, "remote", "remove", "p", "--json").stdout) == {"removed": "p"}
    r = run(root, "pull", "--ff-only", "--rebase", check=False)
    assert r.returncode == 2


def test_log_graph_draws_a_merges_fork(tmp_path):
    root = tmp_path / "g"
    root.mkdir()
    (root / "a.txt").write_text("a")
    run(root, "init")
    run(root, "commit", "-m", "base")
    run(root, "branch", "exp")
    (root / "a.txt").write_text("b")
    run(root, "commit", "-m", "main1")
    run(root, "checkout", "exp")
    (root / "c.txt").write_text("c")
    run(root, "commit", "-m", "exp1")
    run(root, "checkout", "main")
    run(root, "merge", "exp")
    lines = [" ".join(t for t in line.split(" ") if t in ("*", "|", "|\\", "|/"))
             for line in run(root, "log", "--graph", "--oneline").stdout.splitlines()]
    assert lines == ["*", "|\\", "| *", "* |", "|/", "*"], lines


def test_messages_read_as_english(tmp_path):
    root = tmp_path / "w"
    root.mkdir()
    (root / "x.txt").write_bytes(bytes(1 << 20))  # 1 MiB of zeros: stored in a few dozen bytes
    run(root, "init")
    out = run(root, "commit", "-m", "tiny").stdout
    assert "x smaller" not in out  # "30000x smaller" for a few bytes stored says nothing
    r = run(root, "commit", "-m", "", "--allow-empty", check=False)
    assert r.returncode == 2 and "empty message" in r.stderr
    r = run(root, "gc", "--grace", "-1", check=False)
    assert r.returncode == 2
    r = run(tmp_path, "init", "mc0", "--max-chain", "0")
    assert "stored whole" in r.stderr
    (root / "target.txt").write_text("t")
    (root / "link.txt").symlink_to("target.txt")
    out = run(root, "commit", "-m", "link").stdout
    assert "1 symlinked file committed as its content" in out
    run(root, "tag", "v1")
    run(root, "remote", "add", "o", tmp_path / "r")
    run(root, "push", "o")
    out = run(root, "push", "o", "v1").stdout
    assert "o/v1" not in out and "v1" in out


@pytest.mark.parametrize("verb,hint", [("add", "wvc commit"), ("stash", "switch -c"), ("rm", "wvc commit"),
                                       ("blame", "log -- PATH"), ("rev-parse", "show REV --json")])
def test_git_verbs_wvc_lacks_point_to_the_wvc_way(tmp_path, verb, hint):
    r = run(tmp_path, verb, "x", check=False)
    assert r.returncode == 2 and hint in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
