"""``wvc.Repo`` is a facade (issue 52): the verbs and the queries a user asks, by REV; the
parts the repository is made of are behind ``internals``, not its attributes."""

import pytest
import torch
from safetensors.torch import save_file

import wvc
from wvc.repo import Repository


def _steps(repo, n):
    out = []
    for step in range(n):
        save_file({"w": torch.full((64, 64), float(step))}, str(repo.root / "model.safetensors"))
        (repo.root / "notes.txt").write_text(f"step {step}\n" * (step + 1))
        out.append(repo.commit(f"step {step}", metadata={"step": step}).commit)
    return out


def test_the_queries_answer_by_rev(tmp_path):
    repo = wvc.Repo.init(tmp_path / "r")
    assert repo.head() is None and repo.head_branch() == "main" and repo.base() is None and repo.base_dir() is None
    run = _steps(repo, 4)
    assert repo.head() == run[-1] == repo.resolve("main") and repo.resolve("HEAD~2") == run[1]
    assert repo.read_commit("HEAD~1").id == run[2] and repo.read_commit("HEAD").parents == (run[2],)
    assert repo.tree_of("HEAD~1").id == repo.read_commit(run[2]).tree
    changed = {f["path"] for f in repo.changed_files("HEAD")}
    assert changed == {"model.safetensors", "notes.txt"}
    repo.prune(keep={"last": 1})
    assert repo.pruned() == set(run[:-1]) and repo.is_pruned("HEAD~1") and not repo.is_pruned("HEAD")
    assert repo.tree_of("HEAD~1", weights=False).id == repo.read_commit(run[2]).tree  # its listing stays
    with pytest.raises(wvc.WvcError, match="pruned"):
        repo.tree_of("HEAD~1")  # its weights do not
    repo.close()


def test_the_parts_are_behind_internals_not_attributes_of_the_api(tmp_path):
    with wvc.Repo.init(tmp_path / "r") as repo:
        for part in ("store", "graph", "refs", "db", "record", "maintenance_lock"):
            assert not hasattr(repo, part), part
        assert isinstance(repo.internals, Repository) and repo.internals.root == repo.root
    (tmp_path / "r" / "sub").mkdir()
    with wvc.Repo.open(tmp_path / "r" / "sub") as again:  # from a directory below, as git finds its repository
        assert again.root == (tmp_path / "r").resolve()
