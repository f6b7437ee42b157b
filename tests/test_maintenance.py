"""gc, fsck and the write ordering: corruption is found, leftovers of crashes are cleaned."""

import pytest
import torch
from safetensors.torch import save_file

from wvc.errors import CorruptObject

from .conftest import tree_digests


def commit_steps(repo, n, size=4096, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(size, generator=g) * 0.02
    commits = {}
    for i in range(n):
        w += torch.randn(size, generator=g) * 1e-3
        save_file({"w": w.to(torch.bfloat16)}, str(repo.root / "model.safetensors"))
        commits[repo.commit(f"step {i}").commit] = tree_digests(repo.root)
    return commits


def test_fsck_detects_every_single_byte_corruption_in_a_pack(repo):
    commit_steps(repo, 2)
    packs = sorted((repo.root / ".wvc" / "packs").glob("pack-*.pack"))
    for pack in packs:
        data = pack.read_bytes()
        for pos in range(0, len(data), max(1, len(data) // 25)):
            corrupted = bytearray(data)
            corrupted[pos] ^= 0x40
            pack.write_bytes(corrupted)
            repo.internals.store.reader.close()
            assert not repo.fsck().ok, f"flip at {pos} of {pack.name} not found"
        pack.write_bytes(data)
    repo.internals.store.reader.close()
    assert repo.fsck().ok


def test_reads_of_corrupted_objects_fail_loudly(repo):
    commits = commit_steps(repo, 2)
    first = next(iter(commits))
    row = repo.internals.db.query("SELECT pack, offset, length FROM objects WHERE depth = 0 ORDER BY length DESC LIMIT 1")[0]
    pack = repo.root / ".wvc" / "packs" / f"pack-{row[0]}.pack"
    data = bytearray(pack.read_bytes())
    data[row[1] + row[2] - 1] ^= 0xFF  # the last byte of the biggest keyframe payload
    pack.write_bytes(data)
    repo.internals.store.reader.close()
    with pytest.raises(CorruptObject):
        repo.checkout(first, output=repo.root.parent / "out", force=True)


def test_a_corrupt_keyframe_is_named_when_a_delta_on_it_is_read(repo):
    """Only a chain's result is hash-checked on the fast path; a bad link below it must still
    fail the read, and the error must name that link, not the delta read through it."""
    from wvc import ids
    from wvc.codec.container import CODER_STORED, peek

    commits = commit_steps(repo, 2)
    second = list(commits)[1]
    keyframe = repo.internals.db.query(
        "SELECT k.id, k.pack, k.offset, k.length FROM objects d JOIN objects k ON d.base = k.id "
        "WHERE d.depth = 1 ORDER BY k.length DESC LIMIT 1")[0]
    pack = repo.root / ".wvc" / "packs" / f"pack-{keyframe[1]}.pack"
    data = bytearray(pack.read_bytes())
    payload = bytes(data[keyframe[2] : keyframe[2] + keyframe[3]])
    stored = [offset for coder, _, offset, _ in peek(payload).streams if coder == CODER_STORED]
    assert stored, "the keyframe should keep its noisy low-mantissa plane unencoded"
    data[keyframe[2] + stored[0]] ^= 0x01  # still a valid payload: it decodes, to wrong bytes
    pack.write_bytes(data)
    repo.internals.store.reader.close()
    with pytest.raises(CorruptObject, match=ids.short(keyframe[0])):
        repo.checkout(second, output=repo.root.parent / "out", force=True)


def test_gc_removes_unreachable_and_keeps_reachable(repo, monkeypatch):
    main_commits = commit_steps(repo, 2)
    repo.create_branch("exp")
    repo.checkout("exp")
    commit_steps(repo, 2, size=8192)  # different tensor size: new keyframes, not deltas of main
    repo.checkout("main")
    repo.delete_branch("exp", force=True)
    before = repo.fsck()
    kept = repo.gc(grace_seconds=0)  # the reflog still names exp's commits: kept, and said so
    assert kept.commits_removed == 0 and kept.kept_by_reflog == 2 and repo.fsck().objects == before.objects
    monkeypatch.setenv("WVC_REFLOG_EXPIRE_DAYS", "0")
    res = repo.gc(grace_seconds=0)
    assert res.commits_removed == 2 and res.objects_removed > 0
    assert res.bytes_after < res.bytes_before
    assert repo.fsck().ok and repo.fsck().objects < before.objects
    for commit_id, digests in main_commits.items():
        repo.checkout(commit_id)
        assert tree_digests(repo.root) == digests


def test_crash_between_pack_and_transaction_leaves_repo_unchanged(repo, monkeypatch):
    commits = commit_steps(repo, 1)
    save_file({"w": torch.randn(4096).to(torch.bfloat16)}, str(repo.root / "model.safetensors"))

    def crash(*a, **k):
        raise KeyboardInterrupt("simulated crash after the pack is durable")

    monkeypatch.setattr(repo.internals.store, "insert_rows", crash)
    with pytest.raises(KeyboardInterrupt):
        repo.commit("doomed")
    monkeypatch.undo()
    assert [c.id for c in repo.log()] == list(commits)
    fsck = repo.fsck()
    assert fsck.ok and len(fsck.leftovers) == 1  # the orphan pack
    assert repo.gc(grace_seconds=3600).files_removed == 0  # too fresh: could be a live commit
    assert repo.gc(grace_seconds=0).files_removed == 1
    assert repo.fsck().leftovers == []
    assert repo.commit("retry").stored_bytes > 0


def test_concurrent_commit_to_same_branch_is_refused(repo, monkeypatch):
    from wvc.errors import ConcurrentUpdate
    from wvc.api import Repo

    commit_steps(repo, 1)
    other = Repo.open(repo.root)
    (repo.root / "x.txt").write_text("x")
    real_finish = type(repo.internals.store.writer()).finish

    raced = []

    def finish_then_race(self):
        out = real_finish(self)
        if not raced:  # the other writer's own finish must not race again
            raced.append(True)
            # a state-dict commit does not read the working tree, so it does not wait for
            # the working-tree lock this commit holds: only the branch's CAS stands between them
            other.commit("the other writer wins", source={"w": torch.zeros(2)})
        return out

    monkeypatch.setattr(type(repo.internals.store.writer()), "finish", finish_then_race)
    with pytest.raises(ConcurrentUpdate):
        repo.commit("loser")
    assert repo.log()[0].message == "the other writer wins"
    assert repo.fsck().ok
