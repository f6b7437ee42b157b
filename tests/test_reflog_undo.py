"""`HEAD@{1}` after a merge or a pull is the commit before it, so `reset --hard HEAD@{1}`
undoes it as `wvc reset --help` says (issue 37, finding 5)."""

import json

from wvc import Repo, clone

from .test_everyday import run, two_tensors


def _entries(root):
    return json.loads(run(root, "reflog", "--json").stdout)["entries"]


def test_reset_to_head_at_1_undoes_a_merge(tmp_path):
    repo = Repo.init(tmp_path / "m")
    two_tensors(repo.root / "model.safetensors")
    (repo.root / "config.json").write_text("{}")
    repo.commit("base")
    repo.create_branch("exp")
    (repo.root / "config.json").write_text('{"main": 1}')
    before = repo.commit("on main").commit
    repo.checkout("exp")
    (repo.root / "notes.txt").write_text("exp")
    repo.commit("on exp")
    repo.checkout("main")
    merged = repo.merge("exp").commit
    assert merged is not None and merged != before
    entries = _entries(repo.root)
    assert [e["new"] for e in entries[:2]] == [merged, before], entries[:3]
    assert not any(e["message"].startswith("checkout: moving to") and e["new"] == merged for e in entries)
    run(repo.root, "reset", "--hard", "HEAD@{1}")
    with Repo.open(repo.root) as again:
        assert again.head() == before and again.head_branch() == "main"
    assert not (repo.root / "notes.txt").exists()


def test_reset_to_head_at_1_undoes_a_fast_forward_pull(tmp_path):
    src = Repo.init(tmp_path / "src")
    two_tensors(src.root / "model.safetensors")
    first = src.commit("one").commit
    src.remote_add("origin", str(tmp_path / "remote"))
    src.push()
    copy = clone(str(tmp_path / "remote"), tmp_path / "copy")
    two_tensors(src.root / "model.safetensors", 5, 6)
    second = src.commit("two").commit
    src.push()
    run(copy.root, "pull")
    entries = _entries(copy.root)
    assert [e["new"] for e in entries[:2]] == [second, first], entries[:3]
    assert all("back on" not in e["message"] for e in entries)
    run(copy.root, "reset", "--hard", "HEAD@{1}")
    with Repo.open(copy.root) as again:
        assert again.head() == first
