"""Materialize: rebuild a file of a tree from the store, verified as it is written; or, where
a file holding the same bytes is at hand (the source a commit just read), copy it and check
the copy.

The tree may come from a remote, so it is checked against the stored header: the tensor
names, dtypes, shapes and order that the header declares must be those the tree lists.
Every chunk is hash-verified by the store and the header checked against the tree before
the file is renamed into place, so a checkout never leaves a wrong file.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path
from typing import Iterator

from .. import ids
from ..errors import CorruptObject
from ..formats import safetensors as st
from ..fsutil import (SYNC_FILE_RANGE_WRITE, WRITEBACK_BYTES, EarlyWriteback, atomic_writer, fsync_dir, new_temp,
                      sync_file_range)
from ..model.versions import FileEntry
from ..progress import NULL, Progress
from ..store.chunks import ObjectStore
from .scan import content_id


def check_header(entry: FileEntry, header_bytes: bytes) -> st.SafetensorsHeader:
    data_size = entry.size - 8 - len(header_bytes)
    header = st.parse_header(header_bytes, data_size, entry.path)
    listed = [(t.name, t.dtype, t.shape) for t in entry.tensors]
    declared = [(t.name, t.dtype.name, t.shape) for t in header.tensors]
    if listed != declared:
        raise CorruptObject(f"{entry.path}: tree and stored header disagree about its tensors")
    return header


def file_blocks(store: ObjectStore, entry: FileEntry) -> Iterator[bytes]:
    """The bytes of ``entry``, chunk by chunk (``store``: anything with ``get`` and ``get_many``)."""
    if entry.kind == "blob":
        yield from store.get_many(entry.chunks)
        return
    header_bytes = store.get(entry.header)
    yield len(header_bytes).to_bytes(8, "little")
    yield header_bytes
    chunks = store.get_many(c for t in entry.tensors for c in t.chunks)
    for block in chunks:  # (the first chunk only)
        yield block
        break
    # Checked once the first chunk is out, so the pool decodes the next ones meanwhile
    # (before, it waited on the check); nothing is renamed into place unchecked.
    check_header(entry, header_bytes)
    yield from chunks


def write_file(store: ObjectStore, entry: FileEntry, target: Path, progress: Progress = NULL) -> os.stat_result:
    """Atomically replace ``target`` with the file ``entry`` describes; returns its stat.

    Every chunk is checked against its id as it is decoded, and the header against the
    tree, so the bytes are the committed ones. An entry of a format-1 tree also records a
    hash of the file's bytes, which is checked too (format 2 records the content id
    instead, checked when the tree was parsed).
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    h = ids.hasher(ids.FILE) if entry.hash != entry.content_id else None
    size = 0
    with atomic_writer(target, size_hint=entry.size, executable=entry.executable) as fh:
        for block in file_blocks(store, entry):
            fh.write(block)
            if h is not None:
                h.update(block)
            size += len(block)
            progress.advance(len(block))
        if size != entry.size or (h is not None and h.hexdigest() != entry.hash):
            raise CorruptObject(f"{entry.path}: rebuilt file does not match the recorded hash")
    return os.stat(target)


def copy_verified(source: Path, target: Path, entry: FileEntry, chunk_bytes: int,
                  progress: Progress = NULL) -> os.stat_result | None:
    """Atomically replace ``target`` with a copy of ``source`` if the copy holds the bytes
    ``entry`` describes; returns its stat, or None with nothing written (the source changed
    after the commit read it, or is gone). A commit from a directory leaves its file in the
    working tree this way: decoding it from the store cost as much as the commit's own
    encode (a delta's chain decoded for each chunk, every byte written), where a copy is the
    kernel's (a reflink, on a file system that has them)."""
    def fill(out) -> None:
        # (non-blocking: a FIFO put in the source's place must not hang the commit's end)
        with os.fdopen(os.open(source, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)), "rb") as src:
            if not stat.S_ISREG(os.fstat(src.fileno()).st_mode):
                raise OSError(f"{source} is no longer a regular file")
            _copy_file(src, out)

    return _written_if_same(target, entry, chunk_bytes, fill, progress)


TENSOR_SLICE = 64 << 20  # bytes of a tensor brought to the host at once (tensors_verified)


def tensors_verified(header_bytes: bytes, tensors, target: Path, entry: FileEntry, chunk_bytes: int,
                     progress: Progress = NULL) -> os.stat_result | None:
    """:func:`copy_verified` for a state dict's commit: the file written from ``tensors`` (its
    tensors by name, wherever they live) and the stored header, as the commit laid it out."""
    import torch

    def fill(out) -> None:
        writer = EarlyWriteback(out)
        writer.write(len(header_bytes).to_bytes(8, "little"))
        writer.write(header_bytes)
        for t in entry.tensors:
            flat = tensors[t.name].detach().contiguous().reshape(-1).view(torch.uint8)
            for at in range(0, flat.numel(), TENSOR_SLICE):  # (a device's tensor: a slice at a time on the host)
                writer.write(memoryview(flat[at : at + TENSOR_SLICE].cpu().numpy()))

    return _written_if_same(target, entry, chunk_bytes, fill, progress)


def _written_if_same(target: Path, entry: FileEntry, chunk_bytes: int, fill, progress: Progress):
    """``fill(file)`` writes a temp file beside ``target``; renamed into place (fsynced) only if
    its content id, computed from it as a commit computes it, is ``entry``'s: it then names
    the committed chunks, so the file holds the committed bytes. Else None, nothing written."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = new_temp(target.parent, entry.executable)
    try:
        with os.fdopen(fd, "r+b") as out:
            try:
                fill(out)
                out.flush()
                same = content_id(Path(tmp), entry.path, chunk_bytes) == entry.content_id
            except (OSError, KeyError, TypeError, RuntimeError):  # (the source gone; a tensor gone or of another kind)
                same = False
            if not same:
                os.unlink(tmp)
                return None
            os.fsync(out.fileno())
        os.replace(tmp, target)
        fsync_dir(target.parent)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    progress.advance(entry.size)
    return os.stat(target)


def _copy_file(src, out) -> None:
    """``src``'s bytes into ``out`` by the kernel (copy_file_range: no pass through user
    space, a reflink where the file system shares extents), else through a buffer; the
    disk writes started as it goes (EarlyWriteback's reason: the final fsync then waits for
    the last stretch only, not the whole file)."""
    start_writing, done = sync_file_range(), 0
    try:
        while n := os.copy_file_range(src.fileno(), out.fileno(), WRITEBACK_BYTES):
            if start_writing is not None:
                start_writing(out.fileno(), done, n, SYNC_FILE_RANGE_WRITE)
            done += n
    except (AttributeError, OSError):  # (not Linux, an old kernel, or a pair of file systems it refuses)
        src.seek(0)
        out.seek(0)
        out.truncate()
        writer = EarlyWriteback(out)
        while block := src.read(1 << 20):
            writer.write(block)


def tensor_bytes(store: ObjectStore, chunks) -> bytearray:
    out = bytearray()
    for raw in store.get_many(chunks):
        out += raw
    return out
