"""Every writer records a version through one transaction (Repository.record) that checks
the chunks its tree names are still there: a gc may remove an unreachable chunk that a
writer deduplicated against between its plan and its record (issue 33: merge lacked the
check commit made). The version is then refused, with nothing recorded, and the
repository stays whole."""

import pytest
import torch

import wvc
from wvc.errors import MissingObject
from wvc.ops import merge as merge_op


def _tensors(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(4096, generator=g), "b": torch.randn(64, generator=g)}


def _age_packs(root, seconds: int) -> None:
    import sqlite3

    with sqlite3.connect(root / ".wvc" / "wvc.db") as db:
        db.execute("UPDATE packs SET created_at = created_at - ?", (seconds,))


def test_a_merge_refuses_a_chunk_gc_removed_between_its_plan_and_its_record(tmp_path, monkeypatch):
    monkeypatch.setenv("WVC_REFLOG_EXPIRE_DAYS", "0")  # an abandoned merge is unreachable at once
    repo = wvc.Repo.init(tmp_path / "r", chunk_bytes=4096)
    repo.commit("base", _tensors(0))
    repo.create_branch("other")
    repo.commit("ours", _tensors(1))
    repo.commit("theirs", _tensors(2), branch="other")
    ours = repo.resolve("main")
    first = repo.merge("other", strategy="linear")  # its merged chunks are stored now
    merged_chunks = repo.tree_of(first.commit).chunk_ids()
    first_commit = repo.read_commit(first.commit)  # read now: the gc below removes it (unreachable)
    repo.reset(ours, mode="hard")  # the merge abandoned: its computed chunks are unreachable
    _age_packs(tmp_path / "r", 7200)  # past gc's grace period, as if written two hours ago

    real = merge_op.MergeResult  # built after the merge's writer finished, before its record

    def planned_then_gc(*args, **kwargs):
        other = wvc.Repo.open(tmp_path / "r")
        removed = other.gc(grace_seconds=3600).objects_removed  # the merge's own new pack is young
        other.close()
        assert removed > 0
        return real(*args, **kwargs)

    monkeypatch.setattr(merge_op, "MergeResult", planned_then_gc)
    with pytest.raises(MissingObject, match="vanished"):
        repo.merge("other", strategy="linear")
    assert repo.resolve("main") == ours  # nothing recorded, the branch where it was
    head = repo.tree_of(repo.resolve("HEAD"))
    assert head.chunk_ids() <= repo.internals.store.present(head.chunk_ids())
    assert not merged_chunks <= repo.internals.store.present(merged_chunks)  # the race really removed some
    assert repo.fsck().ok

    monkeypatch.setattr(merge_op, "MergeResult", real)  # retried, the merge writes them again
    again = repo.merge("other", strategy="linear")
    # the same version (a commit id also holds the wall-clock second the merge ran in: the
    # retry's may be the next one, which made a comparison of ids fail now and then; and the
    # first merge's commit is gone then, so it is compared as read before the gc)
    assert repo.read_commit(again.commit).tree == first_commit.tree
    assert repo.read_commit(again.commit).parents == first_commit.parents
    assert repo.fsck().ok
