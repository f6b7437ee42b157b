"""Deleting a branch on a remote (issue 37, finding 8): `push --delete REMOTE BRANCH` and
`push REMOTE :BRANCH`, on every kind of remote; `gc --remote` then frees what it alone held."""

import json

from wvc import Repo, clone

from .test_everyday import run, two_tensors


def test_push_delete_removes_the_branch_and_gc_frees_it(tmp_path, remote_url, hub_env):
    repo = Repo.init(tmp_path / "a")
    two_tensors(repo.root / "model.safetensors")
    repo.commit("base")
    repo.remote_add("origin", remote_url)
    repo.push()
    for name in ("run/a", "run/b"):
        repo.create_branch(name)
        repo.checkout(name)
        two_tensors(repo.root / "model.safetensors", hash(name) % 1000, 5)
        repo.commit(name)
        repo.push("origin", name)
        repo.checkout("main")
    assert {"main", "run/a", "run/b"} <= set(json.loads(run(repo.root, "fetch", "--json").stdout)["refs"])
    r = run(repo.root, "push", "--delete", "origin", "run/a")
    assert "deleted origin/run/a" in r.stdout
    out = json.loads(run(repo.root, "push", "origin", ":run/b", "--json").stdout)
    assert out["deleted"] == "refs/heads/run/b"
    assert set(json.loads(run(repo.root, "fetch", "--json").stdout)["refs"]) == {"main"}
    assert "origin/run/a" not in repo.remote_branches() and "origin/run/b" not in repo.remote_branches()
    gc = json.loads(run(repo.root, "gc", "--remote", "origin", "--json").stdout)
    assert gc["objects_removed"] > 0
    copy = clone(remote_url, tmp_path / "copy")
    assert copy.head() == repo.branches()["main"] and copy.fsck().ok
    r = run(repo.root, "push", "--delete", "origin", "run/a", check=False)
    assert r.returncode == 1 and "no branch or tag 'run/a'" in r.stderr
