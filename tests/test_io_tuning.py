"""The speed plumbing under commit and checkout changes no bytes and does what it says."""

import ctypes
import hashlib
import os
import sys

import pytest

from wvc.codec import allocator
from wvc import fsutil


def test_durable_writes_start_writeback_per_stretch_and_keep_every_byte(tmp_path, monkeypatch):
    calls = []
    real = fsutil.sync_file_range()
    if real is None:
        pytest.skip("no sync_file_range here")

    def spy(fd, offset, length, flags):
        calls.append((offset, length, flags))
        return real(fd, offset, length, flags)

    monkeypatch.setattr(fsutil, "WRITEBACK_BYTES", 64 * 1024)
    monkeypatch.setattr(fsutil, "sync_file_range", lambda: spy)
    blocks = [os.urandom(n) for n in (1, 40_000, 70_000, 3, 200_000, 65_536, 10)]
    target = tmp_path / "model.safetensors"
    with fsutil.atomic_writer(target) as fh:
        for block in blocks:
            assert fh.write(block) == len(block)
    data = b"".join(blocks)
    assert hashlib.sha256(target.read_bytes()).digest() == hashlib.sha256(data).digest()
    # each call covers exactly the bytes written since the previous one, in order, from 0
    assert calls and calls[0][0] == 0 and all(flags == fsutil.SYNC_FILE_RANGE_WRITE for _, _, flags in calls)
    assert all(a[0] + a[1] == b[0] for a, b in zip(calls, calls[1:]))
    assert all(length >= 64 * 1024 for _, length, _ in calls)
    assert calls[-1][0] + calls[-1][1] <= len(data)


def test_a_pack_starts_its_writeback_every_8_mib_so_its_final_fsync_is_short(tmp_path, monkeypatch):
    """A pack's fsync is a commit's last step, with nothing to overlap it: the pack starts
    writing back every PACK_WRITEBACK_BYTES (8 MiB), not every 32 MiB as other files do (a
    many-tensor commit's 62 MB pack waited 22-26 ms in its fsync, now 6-7 ms, #21)."""
    from wvc.store.packs import PackWriter

    calls = []
    real = fsutil.sync_file_range()
    if real is None:
        pytest.skip("no sync_file_range here")

    def spy(fd, offset, length, flags):
        calls.append((offset, length))
        return real(fd, offset, length, flags)

    monkeypatch.setattr(fsutil, "sync_file_range", lambda: spy)
    pack = PackWriter(tmp_path)
    payload = os.urandom(1 << 20)
    for k in range(20):  # 20 MiB: under the 32 MiB of other files
        pack.add(hashlib.sha256(bytes([k])).hexdigest(), payload, len(payload), 1, None)
    pack.finish()
    assert len(calls) == 2 and all(length >= fsutil.PACK_WRITEBACK_BYTES for _, length in calls)
    assert fsutil.PACK_WRITEBACK_BYTES == 8 << 20 < fsutil.WRITEBACK_BYTES


def test_a_non_durable_write_is_not_wrapped(tmp_path):
    with fsutil.atomic_writer(tmp_path / "f", durable=False) as fh:
        assert not isinstance(fh, fsutil.EarlyWriteback)
        fh.write(b"x")
    assert (tmp_path / "f").read_bytes() == b"x"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_malloc_thresholds_are_applied_on_glibc():
    try:
        ctypes.CDLL(None).mallopt
    except AttributeError:
        pytest.skip("not glibc")
    assert allocator.keep_chunk_buffers() is True
    assert allocator.keep_chunk_buffers() is True  # once per process; later calls say so again


# -- O_DIRECT writes of big durable files ---------------------------------------------------

needs_o_direct = pytest.mark.skipif(not hasattr(os, "O_DIRECT"), reason="no O_DIRECT on this platform")


@needs_o_direct
@pytest.mark.parametrize("sizes", [
    (0,),
    (1,),
    (4095,),
    (4096,),
    (8, 300, 16384),  # a tail shorter than one block after a full buffer
    (16384, 16384, 16384, 16384),  # whole buffers only: no tail
    (5, 40_000, 70_001, 3, 65_536, 10),
])
def test_direct_writes_keep_every_byte_and_the_exact_length(tmp_path, monkeypatch, sizes):
    monkeypatch.setattr(fsutil, "DIRECT_BUFFER", 16384)
    monkeypatch.setattr(fsutil, "DIRECT_MIN_BYTES", 0)
    monkeypatch.setenv("WVC_DIRECT_IO", "1")
    blocks = [os.urandom(n) for n in sizes]
    target = tmp_path / "model.safetensors"
    with fsutil.atomic_writer(target, size_hint=1) as fh:
        # where the file system takes O_DIRECT (ext4, xfs) this is the direct writer;
        # elsewhere it falls back to the page cache, and the bytes must be the same
        for block in blocks:
            assert fh.write(block) == len(block)
    data = b"".join(blocks)
    assert target.stat().st_size == len(data)
    assert hashlib.sha256(target.read_bytes()).digest() == hashlib.sha256(data).digest()


@needs_o_direct
def test_a_file_system_refusing_o_direct_writes_falls_back_to_ordinary_writes(tmp_path, monkeypatch):
    monkeypatch.setattr(fsutil, "DIRECT_BUFFER", 8192)
    monkeypatch.setattr(fsutil, "DIRECT_MIN_BYTES", 0)
    monkeypatch.setenv("WVC_DIRECT_IO", "1")
    real_pwrite, refused = os.pwrite, []

    def pwrite(fd, data, offset):
        import fcntl

        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            refused.append(offset)
            raise OSError(22, "Invalid argument")  # what tmpfs or NFS answers
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(fsutil.os, "pwrite", pwrite)
    data = os.urandom(30_000)
    target = tmp_path / "f"
    with fsutil.atomic_writer(target, size_hint=1) as fh:
        if not isinstance(fh, fsutil.DirectWriter):
            pytest.skip("this file system refuses O_DIRECT already at open")
        fh.write(data[:10_000])
        fh.write(data[10_000:])
    assert refused == [0]  # refused once, then the flag was cleared
    assert target.read_bytes() == data


def test_direct_io_can_be_turned_off(tmp_path, monkeypatch):
    monkeypatch.setattr(fsutil, "DIRECT_MIN_BYTES", 0)
    monkeypatch.setenv("WVC_DIRECT_IO", "0")
    monkeypatch.setattr(fsutil, "physical_memory", lambda: 0)  # auto would pick O_DIRECT
    with fsutil.atomic_writer(tmp_path / "f", size_hint=1) as fh:
        assert isinstance(fh, fsutil.EarlyWriteback)
        fh.write(b"x")
    assert (tmp_path / "f").read_bytes() == b"x"


@needs_o_direct
def test_by_default_only_files_too_big_to_stay_cached_bypass_the_page_cache(monkeypatch):
    monkeypatch.delenv("WVC_DIRECT_IO", raising=False)
    monkeypatch.setattr(fsutil, "physical_memory", lambda: 8 << 30)
    assert not fsutil.wants_direct_io(1 << 30)  # stays in the cache for the load that follows
    assert fsutil.wants_direct_io(5 << 30)  # larger than half the memory
    assert not fsutil.wants_direct_io(32 << 20)  # never below DIRECT_MIN_BYTES
    monkeypatch.setenv("WVC_DIRECT_IO", "1")
    assert fsutil.wants_direct_io(1 << 30) and not fsutil.wants_direct_io(32 << 20)


def test_checkout_through_direct_writes_is_byte_identical(repo, monkeypatch):
    import torch
    from safetensors.torch import save_file

    from tests.conftest import sha256

    monkeypatch.setattr(fsutil, "DIRECT_MIN_BYTES", 0)  # every durable file takes the direct path
    monkeypatch.setenv("WVC_DIRECT_IO", "1")
    monkeypatch.setattr(fsutil, "DIRECT_BUFFER", 64 * 1024)  # several buffers and a ragged tail
    path = repo.root / "model.safetensors"
    g = torch.Generator().manual_seed(0)
    versions = []
    for step in range(2):
        save_file({"w": torch.randn(300, 257, generator=g).to(torch.bfloat16), "b": torch.randn(7, generator=g)},
                  str(path), metadata={"step": str(step)})
        versions.append((repo.commit(f"step {step}").commit, sha256(path)))
    for commit, digest in versions:
        out = repo.root.parent / f"out-{commit[:8]}"
        repo.checkout(commit, output=out, force=True)
        assert sha256(out / "model.safetensors") == digest


def test_the_writer_works_ahead_by_bytes_not_by_chunk_count(repo, monkeypatch):
    from wvc.formats.dtypes import BYTES
    from wvc.codec import pool

    monkeypatch.setattr(pool, "IN_FLIGHT_BYTES", 64 * 1024)
    writer = repo.internals.store.writer()
    seen = []
    real_drain = writer._drain_one

    def drain():
        seen.append((len(writer.in_flight), writer.in_flight_bytes))
        real_drain()

    monkeypatch.setattr(writer, "_drain_one", drain)
    big, smalls = os.urandom(60 * 1024), [os.urandom(512) for _ in range(20)]
    with writer:
        ids = [writer.put(big, BYTES)] + [writer.put(s, BYTES) for s in smalls]
        pack, rows = writer.finish()
        repo.internals.store.insert_rows(pack, rows)
    # small chunks queue up behind the big one instead of stalling at a fixed count ...
    assert max(n for n, _ in seen) > 4
    # ... and what is in flight stays within the byte bound plus the chunk just offered
    assert max(b for _, b in seen) < 64 * 1024 + 60 * 1024
    assert [repo.internals.store.get(i) for i in ids] == [big, *smalls]


@needs_o_direct
@pytest.mark.parametrize("failing", ["every write", "the padded tail"])
def test_a_failing_direct_write_leaves_the_target_as_it_was_and_no_writer_thread(tmp_path, monkeypatch, failing):
    import threading

    monkeypatch.setattr(fsutil, "DIRECT_BUFFER", 8192)
    monkeypatch.setattr(fsutil, "DIRECT_MIN_BYTES", 0)
    monkeypatch.setenv("WVC_DIRECT_IO", "1")
    real_pwrite = os.pwrite

    def pwrite(fd, data, offset):
        if failing == "every write" or len(data) < 8192:
            raise OSError(28, "No space left on device")
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(fsutil.os, "pwrite", pwrite)
    target = tmp_path / "f"
    target.write_bytes(b"old")
    with pytest.raises(OSError, match="No space"):
        with fsutil.atomic_writer(target, size_hint=1) as fh:
            if not isinstance(fh, fsutil.DirectWriter):
                pytest.skip("this file system refuses O_DIRECT already at open")
            fh.write(os.urandom(20_000))  # two full buffers and a tail
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["f"]  # the temp file is gone
    assert not [t for t in threading.enumerate() if t.name.startswith("wvc-write")]
