"""Compaction on a directory remote builds merged packs from the remote's own packs
(Backend.compose): a long run uploads about what it stores, not each byte once per tier."""

import os
from pathlib import Path

import pytest
import torch

from wvc import Repo, clone
from wvc.errors import RemoteError
from wvc.remotes import compaction, step_records
from wvc.remotes.path import PathBackend

from .conftest import tree_digests
from .test_long_history import TinyTrainer


def stored(repo) -> int:
    return sum(e.stored_bytes for e in repo.log())


def push_run(root, url, steps=120):
    """A 1 MB bf16 tensor, 2.5% of it moving a step, a commit and a push a step: returns
    (repository, bytes uploaded, pushes that compacted, bytes of followers' step records)."""
    from wvc.remotes.layout import step_path

    repo = Repo.init(root)
    repo.remote_add("origin", url)
    g = torch.Generator().manual_seed(0)
    w = torch.randn(512, 1024, generator=g).to(torch.bfloat16)
    uploaded = compacting = recorded = 0
    for i in range(steps):
        idx = torch.randint(0, w.numel(), (w.numel() // 40,), generator=g)
        w.view(-1)[idx] += torch.randn(idx.numel(), generator=g).to(torch.bfloat16) * 1e-2
        commit = repo.commit(f"step {i}", source={"w": w.clone()}, branch="main").commit
        res = repo.push()
        uploaded += res.uploaded_bytes
        compacting += bool(res.files_replaced)
        record = Path(url) / step_path(commit)
        recorded += record.stat().st_size if record.exists() else 0
    return repo, uploaded, compacting, recorded


def test_a_directory_remote_receives_about_what_is_stored_over_many_compacting_pushes(tmp_path, monkeypatch):
    remote = tmp_path / "remote"
    repo, uploaded, compacting, recorded = push_run(tmp_path / "a", str(remote))
    assert compacting >= 20  # compaction ran all along (a merge every 3-4 pushes in tier 0)
    # catalogs, indexes and retired records included; followers' step records apart (an
    # anchor's record, 1 step in 4, carries its delta against the step before, and so may the
    # step after it, whose stored payload lost the step before as its context: 0.12 here)
    assert uploaded - recorded <= 1.1 * stored(repo), (uploaded, recorded, stored(repo))
    assert recorded <= 0.15 * stored(repo), (recorded, stored(repo))
    copy = clone(str(remote), tmp_path / "copy")
    assert tree_digests(copy.root) == tree_digests(repo.root) and copy.fsck().ok
    assert len(copy.log()) == 120
    for entry in repo.log()[::17]:  # every version reads back exactly
        assert copy.tree_of(entry.id).id == repo.tree_of(entry.id).id
        out = _checked_out(copy, entry.id, tmp_path / "out")
        assert tree_digests(out) == tree_digests(_checked_out(repo, entry.id, tmp_path / "want"))

    # the same run where the backend cannot compose: each byte is sent once per tier (2.5x
    # what is stored here, against 1.05x composed; 6.3x when tier 0 ran to 1 MiB)
    monkeypatch.setattr(PathBackend, "composes", False)
    repo2, plain, _, _ = push_run(tmp_path / "b", str(tmp_path / "remote2"))
    assert plain > 2 * uploaded, (plain, uploaded)
    # ... once per tier, not once per merge: tier 0 is the one tier a merge can stay in,
    # so a large tier 0 rewrote its biggest segment every 3 pushes
    assert plain <= 3 * stored(repo2), (plain, stored(repo2))


def _checked_out(repo, commit, out):
    import shutil

    shutil.rmtree(out, ignore_errors=True)
    repo.checkout(commit, output=out)
    return out


def damage_recipes(monkeypatch):
    """Make compaction's recipes name a source range one byte off what the client read (a
    source that changed meanwhile); returns the real merge_segments."""
    real = compaction.merge_segments

    def damaged(*args, **kwargs):
        path, catalog, recipe = real(*args, **kwargs)
        i = next(k for k, p in enumerate(recipe.pieces) if not isinstance(p, bytes))
        source, offset, length = recipe.pieces[i]
        recipe.pieces[i] = (source, offset + 1, length)
        return path, catalog, recipe

    monkeypatch.setattr(compaction, "merge_segments", damaged)
    return real


def test_a_composed_pack_that_comes_out_wrong_is_never_made_visible(tmp_path, monkeypatch):
    remote = tmp_path / "remote"
    repo = Repo.init(tmp_path / "a")
    repo.remote_add("origin", str(remote))
    trainer = TinyTrainer(repo)
    trainer.push_steps(f"step {i}" for i in range(3))
    before = sorted(os.listdir(remote / "packs"))
    real = damage_recipes(monkeypatch)
    trainer.commit("step 3")  # this push compacts
    with pytest.raises(RemoteError, match="did not come out as composed"):
        repo.push()
    assert sorted(os.listdir(remote / "packs")) == before  # no file, no temp file left
    monkeypatch.setattr(compaction, "merge_segments", real)
    repo.push()
    copy = clone(str(remote), tmp_path / "copy")
    assert tree_digests(copy.root) == tree_digests(repo.root) and copy.fsck().ok


def big_run(root, url, steps=4):
    """A 12 MiB bf16 tensor replaced wholesale each step (keyframes of about 8 MiB a push),
    two segments a tier: each push merges, with ranges long enough to be S3 parts."""
    repo = Repo.init(root)
    repo.remote_add("origin", url)
    g = torch.Generator().manual_seed(1)
    uploaded = 0
    for i in range(steps):
        repo.commit(f"step {i}", source={"w": torch.randn(6 << 20, generator=g).to(torch.bfloat16)}, branch="main")
        uploaded += repo.push().uploaded_bytes
    return repo, uploaded


def test_an_s3_remote_copies_what_it_holds_when_compacting(tmp_path, s3_env, monkeypatch):
    """UploadPartCopy: a merged pack's long ranges of the remote's own packs are copied on the
    server; only the new payloads, the index and the catalog are sent."""
    from wvc.remotes.s3 import S3Backend

    from .conftest import new_bucket

    monkeypatch.setenv("WVC_COMPACT_FANOUT", "2")
    url = f"s3://{new_bucket()}/run"
    repo, uploaded = big_run(tmp_path / "a", url)
    assert uploaded <= 1.1 * stored(repo), (uploaded, stored(repo))
    copy = clone(url, tmp_path / "copy")
    assert copy.fsck().ok and len(copy.log()) == 4
    for entry in repo.log():
        assert tree_digests(_checked_out(copy, entry.id, tmp_path / "out")) == \
            tree_digests(_checked_out(repo, entry.id, tmp_path / "want"))

    monkeypatch.setattr(S3Backend, "composes", False)  # the same run, every merged pack sent whole
    _, plain = big_run(tmp_path / "b", f"s3://{new_bucket()}/run")
    assert plain > 1.8 * uploaded, (plain, uploaded)


def test_an_s3_copy_that_does_not_hold_the_clients_bytes_is_sent_instead(tmp_path, s3_env, monkeypatch):
    """A copied part whose ETag is not the MD5 of the client's bytes there (a source changed
    since it was read) aborts the copy: the verified pack is uploaded whole, nothing else."""
    from .conftest import new_bucket

    monkeypatch.setenv("WVC_COMPACT_FANOUT", "2")
    url = f"s3://{new_bucket()}/run"
    repo, _ = big_run(tmp_path / "a", url, steps=1)
    damage_recipes(monkeypatch)
    g = torch.Generator().manual_seed(7)
    repo.commit("step 1", source={"w": torch.randn(6 << 20, generator=g).to(torch.bfloat16)}, branch="main")
    result = repo.push()
    assert result.files_replaced  # it merged
    packs = [p for p in os.listdir(tmp_path / "a" / ".wvc" / "packs") if p.endswith(".pack")]
    assert result.uploaded_bytes >= sum(os.path.getsize(tmp_path / "a" / ".wvc" / "packs" / p) for p in packs)
    copy = clone(url, tmp_path / "copy")
    assert copy.fsck().ok
    assert tree_digests(copy.root) == tree_digests(repo.root)


def test_the_hub_deduplicates_a_merged_pack_down_to_its_new_payloads(tmp_path, hub_env, monkeypatch):
    """The Hub cannot compose; Xet deduplicates by content-defined chunks. A pack's payloads
    end in XET_BOUNDARY, where the chunker cuts, and a merge copies each pack up to it as a
    block: the merged pack's chunks are the packs' own, so what Xet receives (xorbs) stays
    near what is stored. Before: a small pack was one chunk running on into its index, and
    every merge sent it again (xorbs ~1.9x what was stored over these pushes)."""
    hub = hub_env
    # no step records: an anchor's record carries its step payload (1 step in 4, and the
    # step after), which is not what this measures (see the directory test above)
    monkeypatch.setattr(step_records, "KEEP", 0)
    repo = Repo.init(tmp_path / "a")
    repo.remote_add("hub", f"hf://team/dedup-{tmp_path.name}")
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(1 << 19, generator=g) * 0.02).to(torch.bfloat16)  # 1 MB
    stored = sent = compacted = 0
    for i in range(40):
        if i:
            w.view(torch.int16)[torch.randint(0, w.numel(), (w.numel() // 50,), generator=g)] += 1
        res = repo.commit(f"step {i}", source={"w": w.clone()}, branch="main")
        before = hub.received_bytes.get("xet-xorbs", 0)
        pushed = repo.push("hub", "main")
        if i:
            stored += res.stored_bytes
            sent += hub.received_bytes.get("xet-xorbs", 0) - before
            compacted += bool(pushed.files_replaced)
    assert compacted >= 8  # (merges happened: tier 0 into tier 1, and on)
    assert sent <= 1.15 * stored, (sent, stored)
