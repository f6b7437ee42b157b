"""A DCP save or a Publisher committing onto the checked-out branch leaves a working tree
that matches HEAD, and a plain commit never records a tree that drops every file without
consent (issue 37, finding 4: status listed every file as deleted, and `wvc commit` then
recorded an empty tree)."""

import hashlib

import pytest
import torch
import torch.distributed.checkpoint as dcp

from wvc import Repo
from wvc.errors import NothingToCommit
from wvc.integrations.dcp import WvcStorageWriter
from wvc.integrations.publisher import Publisher

from .conftest import tree_digests
from .test_everyday import run


def _base(tmp_path):
    root = tmp_path / "model"
    root.mkdir()
    (root / "config.json").write_text('{"hidden": 8}')
    run(root, "init")
    run(root, "commit", "-m", "config")
    return root


def _clean(root):
    r = run(root, "status", "--json")
    import json

    st = json.loads(r.stdout)
    return st


def test_a_dcp_save_onto_heads_branch_leaves_a_clean_working_tree(tmp_path):
    root = _base(tmp_path)
    sd = {"w": torch.arange(64, dtype=torch.float32).reshape(8, 8), "b": torch.ones(8)}
    dcp.save(sd, storage_writer=WvcStorageWriter(root, message="save 1"))
    st = _clean(root)
    assert not st["deleted"] and not st["modified"] and not st["added"], st
    with Repo.open(root) as repo:
        head_tree = repo.tree_of("HEAD")
        want = {f.path for f in head_tree.files}
    assert set(tree_digests(root)) == want
    assert "config.json" in want and (root / "config.json").read_text() == '{"hidden": 8}'  # carried over
    # a second save moves the files along; a plain commit then has nothing to record
    sd["w"] += 1
    dcp.save(sd, storage_writer=WvcStorageWriter(root, message="save 2"))
    st = _clean(root)
    assert not st["deleted"] and not st["modified"] and not st["added"], st
    r = run(root, "commit", "-m", "plain", check=False)
    assert r.returncode != 0 and "nothing to commit" in r.stderr
    loaded = {"w": torch.zeros(8, 8), "b": torch.zeros(8)}
    from wvc.integrations.dcp import WvcStorageReader

    dcp.load(loaded, storage_reader=WvcStorageReader(root))
    assert torch.equal(loaded["w"], sd["w"]) and torch.equal(loaded["b"], sd["b"])


def test_a_publisher_onto_heads_branch_leaves_a_clean_working_tree(tmp_path):
    root = _base(tmp_path)
    pub = Publisher(root, "main")
    w = torch.randn(16, 16)
    for step in range(3):
        pub.publish({"w": w + step}, message=f"step {step}", metadata={"step": step})
    assert pub.close(timeout=120)
    st = _clean(root)
    assert not st["deleted"] and not st["modified"] and not st["added"], st
    with Repo.open(root) as repo:
        entry = {f.path: f for f in repo.tree_of("HEAD").files}
        assert set(entry) == set(tree_digests(root))
        data = repo.load_state_dict("HEAD")
    assert torch.equal(data["w"], w + 2)
    assert (root / "config.json").read_text() == '{"hidden": 8}'


def test_a_working_copy_edited_by_the_user_is_kept_when_a_writer_commits(tmp_path):
    root = _base(tmp_path)
    with Repo.open(root) as repo:
        repo.commit("sd", {"w": torch.zeros(4)})
    (root / "model.safetensors").write_bytes(b"my own edit")
    with Repo.open(root) as repo:
        repo.commit("sd 2", {"w": torch.ones(4)}, branch="main")
    assert (root / "model.safetensors").read_bytes() == b"my own edit"
    assert _clean(root)["modified"] == ["model.safetensors"]


def test_commit_refuses_a_tree_that_drops_every_file_without_consent(tmp_path):
    root = _base(tmp_path)
    (root / "config.json").unlink()
    r = run(root, "commit", "-m", "oops", check=False)
    assert r.returncode != 0 and "no files" in r.stderr and "--allow-empty" in r.stderr
    with Repo.open(root) as repo:
        assert len(repo.log()) == 1
        with pytest.raises(NothingToCommit):
            repo.commit("oops")
        repo.commit("really", allow_empty=True)
        assert repo.tree_of("HEAD").files == ()


def _checkpoint(path, seed: int) -> bytes:
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    save_file({"w": torch.randn(256, 64, generator=g).to(torch.bfloat16), "b": torch.randn(64, generator=g)},
              str(path / "model.safetensors"))
    (path / "config.json").write_text('{"hidden": 64}')
    return (path / "model.safetensors").read_bytes()


def _committed(repo, out) -> bytes:
    repo.checkout("HEAD", output=out)
    return (out / "model.safetensors").read_bytes()


def test_a_commit_from_a_directory_leaves_the_working_tree_the_bytes_it_read(tmp_path, monkeypatch):
    """The working tree is refreshed to a commit from a directory with the files as the commit read
    them (written as they were hashed), not decoded from the store."""
    import wvc.worktree.refresh as follow

    def decoded(*_a, **_k):
        raise AssertionError("the file was decoded from the store")

    root = tmp_path / "repo"
    repo = Repo.init(root)
    for k in range(3):
        want = _checkpoint(tmp_path / f"ckpt-{k}", k)
        monkeypatch.setattr(follow, "write_file", decoded)
        repo.commit(f"step {k}", source=tmp_path / f"ckpt-{k}")
        monkeypatch.undo()
        assert (root / "model.safetensors").read_bytes() == want
        assert (root / "model.safetensors").read_bytes() == _committed(repo, tmp_path / f"out-{k}")
    assert repo.status().clean
    assert not [p for p in root.iterdir() if p.name.startswith(".wvc-tmp")]


def test_a_source_rewritten_after_the_commit_read_it_is_not_what_the_working_tree_gets(tmp_path, monkeypatch):
    """The working tree gets the bytes the commit read and recorded, not what the source holds
    by the time the commit is recorded (the trainer saved again meanwhile)."""
    import wvc.ops.commit as commit_op

    root = tmp_path / "repo"
    repo = Repo.init(root)
    committed = _checkpoint(tmp_path / "ckpt", 0)
    real = commit_op.refresh_worktree

    def rewritten_first(*args, **kwargs):
        _checkpoint(tmp_path / "ckpt", 1)
        return real(*args, **kwargs)

    monkeypatch.setattr(commit_op, "refresh_worktree", rewritten_first)
    repo.commit("step 0", source=tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "model.safetensors").read_bytes() != committed
    assert (root / "model.safetensors").read_bytes() == committed == _committed(repo, tmp_path / "out")
    assert repo.status().clean
    assert not [p for p in root.iterdir() if p.name.startswith(".wvc-tmp")]


def test_a_failed_commit_from_a_directory_leaves_no_copies_behind(tmp_path, monkeypatch):
    import wvc.ops.commit as commit_op

    root = tmp_path / "repo"
    repo = Repo.init(root)
    _checkpoint(tmp_path / "ckpt", 0)

    def fails(*_a, **_k):
        raise OSError("disk gone")

    monkeypatch.setattr(commit_op, "refresh_worktree", fails)
    with pytest.raises(OSError):
        repo.commit("step 0", source=tmp_path / "ckpt")
    assert sorted(p.name for p in root.iterdir()) == [".wvc"]


def test_a_state_dict_commit_writes_the_working_tree_from_its_tensors(tmp_path, monkeypatch):
    """A state dict committed onto HEAD's branch reaches the working tree from its tensors and
    the stored header (checked as a copy is), not decoded from the store; a tensor changed
    after the commit read it fails the check, and the committed bytes are decoded instead."""
    import wvc.worktree.refresh as follow

    def decoded(*_a, **_k):
        raise AssertionError("the file was decoded from the store")

    root = tmp_path / "repo"
    repo = Repo.init(root)
    g = torch.Generator().manual_seed(0)
    sd = {"w": torch.randn(128, 64, generator=g).to(torch.bfloat16), "b": torch.randn(64, generator=g)}
    for k in range(3):
        sd["w"].view(torch.int16)[k::7] += 1
        monkeypatch.setattr(follow, "write_file", decoded)
        repo.commit(f"step {k}", source=sd)
        monkeypatch.undo()
        assert (root / "model.safetensors").read_bytes() == _committed(repo, tmp_path / f"out-{k}")
    assert repo.status().clean

    import wvc.ops.commit as commit_op

    real = commit_op.refresh_worktree

    def trained_on(*args, **kwargs):
        sd["b"] += 1  # the trainer's next step, before the working tree is written
        return real(*args, **kwargs)

    sd["w"] += 1
    monkeypatch.setattr(commit_op, "refresh_worktree", trained_on)
    repo.commit("step 3", source=sd)
    assert (root / "model.safetensors").read_bytes() == _committed(repo, tmp_path / "out-3")
    assert repo.status().clean
    assert not [p for p in root.iterdir() if p.name.startswith(".wvc-tmp")]


def test_a_teed_file_removed_before_the_follow_takes_it_is_decoded_instead(tmp_path, monkeypatch):
    """A `gc --grace 0` may remove a teed file between the read and the follow (its writer's
    lock went when it was written): the follow then decodes the file from the store."""
    import os

    import wvc.ops.commit as commit_op

    root = tmp_path / "repo"
    repo = Repo.init(root)
    committed = _checkpoint(tmp_path / "ckpt", 0)
    real = commit_op.refresh_worktree

    def collected_first(*args, **kwargs):
        for p in root.iterdir():
            if p.name.startswith(".wvc-tmp"):
                os.unlink(p)
        return real(*args, **kwargs)

    monkeypatch.setattr(commit_op, "refresh_worktree", collected_first)
    repo.commit("step 0", source=tmp_path / "ckpt")
    assert (root / "model.safetensors").read_bytes() == committed
    assert repo.status().clean


def test_a_state_dicts_tensors_reach_the_working_tree_a_slice_at_a_time(tmp_path, monkeypatch):
    """A tensor is brought to the host TENSOR_SLICE bytes at a time (a device's tensor is never
    copied whole); the file is the same."""
    import wvc.worktree.refresh as follow
    import wvc.worktree.materialize as materialize

    def decoded(*_a, **_k):
        raise AssertionError("the file was decoded from the store")

    monkeypatch.setattr(materialize, "TENSOR_SLICE", 1000)
    monkeypatch.setattr(follow, "write_file", decoded)
    root = tmp_path / "repo"
    repo = Repo.init(root)
    sd = {"w": torch.randn(300, 7).to(torch.bfloat16), "b": torch.randn(3, 5, 11)[:, 1]}  # (b: not contiguous)
    repo.commit("step 0", source=sd)
    assert (root / "model.safetensors").read_bytes() == _committed(repo, tmp_path / "out")
