"""Decodes read packs through mappings (PackReader.view), not copies: the same bytes as a
read, a pack's resident pages bounded by the windows kept, damage at rest caught (#21: the
copy of every payload and its buffer's page faults were a tenth of a many-tensor checkout)."""

import hashlib
import os
from pathlib import Path

import pytest

from wvc.errors import CorruptObject
from wvc.store.packs import PackReader, PackWriter, pack_filename


def _pack(tmp_path: Path, sizes) -> tuple[str, list]:
    writer = PackWriter(tmp_path)
    entries = []
    for k, size in enumerate(sizes):
        payload = os.urandom(size)
        entries.append((writer.add(hashlib.sha256(bytes([k % 256, k // 256])).hexdigest(), payload, size, 1, None),
                        payload))
    name, _ = writer.finish()
    return name, entries


def _mappings_of(path: Path) -> int:
    with open("/proc/self/maps") as fh:
        return sum(1 for line in fh if line.rstrip().endswith(str(path)))


def test_a_view_holds_the_same_bytes_as_a_read_across_window_edges(tmp_path, monkeypatch):
    monkeypatch.setattr(PackReader, "WINDOW", 1 << 16)  # (64 KiB windows: many payloads cross an edge)
    name, entries = _pack(tmp_path, [1, 4095, 4097, 70_000, 65_536, 200_000, 3, 131_072])
    reader = PackReader(tmp_path)
    for entry, payload in entries:
        view = reader.view(name, entry.offset, entry.length)
        assert bytes(view) == payload == reader.read(name, entry.offset, entry.length)
        assert view.readonly
    reader.close()


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs /proc")
def test_only_the_last_windows_stay_mapped(tmp_path, monkeypatch):
    """However large the pack, a reader keeps WINDOWS windows mapped once their views are
    gone; a window with a live view stays mapped (and readable) after its eviction."""
    monkeypatch.setattr(PackReader, "WINDOW", 1 << 16)
    monkeypatch.setattr(PackReader, "WINDOWS", 3)
    name, entries = _pack(tmp_path, [16_384] * 64)  # 1 MiB: 16 windows
    path = tmp_path / pack_filename(name)
    reader = PackReader(tmp_path)
    held = reader.view(name, entries[0][0].offset, entries[0][0].length)
    for entry, payload in entries:
        assert bytes(reader.view(name, entry.offset, entry.length)) == payload
        assert _mappings_of(path) <= 3 + 1  # (the kept windows, and the first one while it is held)
    assert bytes(held) == entries[0][1]  # evicted long ago, still mapped for its view
    del held
    assert _mappings_of(path) <= 3
    reader.close()
    assert _mappings_of(path) == 0


def test_a_pack_shorter_than_its_index_says_is_caught(tmp_path):
    name, entries = _pack(tmp_path, [10_000, 10_000])
    path = tmp_path / pack_filename(name)
    last = entries[-1][0]
    os.truncate(path, last.offset + last.length - 1)  # (at rest, before any reader maps it)
    reader = PackReader(tmp_path)
    assert bytes(reader.view(name, entries[0][0].offset, entries[0][0].length)) == entries[0][1]
    with pytest.raises(CorruptObject, match="truncated"):
        reader.view(name, last.offset, last.length)
    with pytest.raises(CorruptObject, match="truncated"):
        reader.read(name, last.offset, last.length)
    with pytest.raises(CorruptObject, match="missing"):
        reader.view("0" * 64, 0, 1)


def test_a_payload_of_up_to_half_a_window_is_a_slice_of_a_kept_window(tmp_path, monkeypatch):
    """Windows start every half window, so a payload that crosses one window's edge lies
    inside the next: no mapping of its own (a mapping per payload cost more than the copy).
    A 4 MiB chunk's payloads and 8 MiB windows: a third of an LLM's keyframes crossed an
    edge of windows laid end to end."""
    monkeypatch.setattr(PackReader, "WINDOW", 1 << 16)
    name, entries = _pack(tmp_path, [30_000, 32_768, 20_000, 1] * 8 + [32_769, 50_000])
    reader = PackReader(tmp_path)
    alone = 0
    for entry, payload in entries:
        view = reader.view(name, entry.offset, entry.length)
        assert bytes(view) == payload
        kept = any(view.obj is window.obj for window in reader._windows.values())
        assert kept or entry.length > (1 << 15), entry
        alone += not kept
    assert alone <= 2
    reader.close()


def test_a_pack_that_cannot_be_mapped_is_read_by_copy(tmp_path, monkeypatch):
    """A file system without mmap (some FUSE mounts), or a process out of mappings: the
    same bytes, copied; a pack that shrank after it was opened is still called truncated."""
    import errno
    import mmap as mmap_module

    name, entries = _pack(tmp_path, [10_000, 5_000_000, 10_000])
    reader = PackReader(tmp_path)

    def refuse(*args, **kwargs):
        raise OSError(errno.ENODEV, os.strerror(errno.ENODEV))

    monkeypatch.setattr(mmap_module, "mmap", refuse)
    for entry, payload in entries:
        assert bytes(reader.view(name, entry.offset, entry.length)) == payload
    last = entries[-1][0]
    os.truncate(tmp_path / pack_filename(name), last.offset + 10)  # (after the reader sized it)
    with pytest.raises(CorruptObject, match="truncated"):
        reader.view(name, last.offset, last.length)
    reader.close()


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts descriptors in /proc")
def test_a_repository_nobody_closed_gives_its_pack_descriptors_back(tmp_path):
    """Found when a test worker ran out of descriptors (EMFILE, ~20k open): ``wvc.open`` on a
    local repository opens a Repository for its view that nothing closes, and its reader's pack
    descriptors were bare numbers, never closed when the reader was collected."""
    import gc

    import torch

    import wvc
    from wvc.api import Repo

    repo = Repo.init(tmp_path / "r")
    repo.commit("v", source={"w": torch.randn(256, 256)})
    repo.close()

    def open_and_read():
        view = wvc.open(str(tmp_path / "r"))
        return [view.read_file(path) for path in sorted(view.files)]

    want = open_and_read()
    gc.collect()
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(40):
        assert open_and_read() == want
    gc.collect()
    assert len(os.listdir("/proc/self/fd")) <= before + 2  # (not one a read: 40 before the fix)
