"""The speed plumbing under commit and checkout changes no bytes and does what it says."""

import ctypes
import hashlib
import os
import sys

import pytest

from wvc import allocator, fsutil


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
