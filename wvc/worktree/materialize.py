"""Materialize: rebuild a file of a tree from the store, verified as it is written; or write
it from the state dict a commit just read, and check what was written.

The tree may come from a remote, so it is checked against the stored header: the tensor
names, dtypes, shapes and order that the header declares must be those the tree lists.
Every chunk is hash-verified by the store and the header checked against the tree before
the file is renamed into place, so a checkout never leaves a wrong file.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator

from .. import ids
from ..errors import CorruptObject
from ..formats import safetensors as st
from ..fsutil import EarlyWriteback, atomic_writer, fsync_dir, new_temp
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


TENSOR_SLICE = 64 << 20  # bytes of a tensor brought to the host at once (tensors_verified)


def tensors_verified(header_bytes: bytes, tensors, target: Path, entry: FileEntry, chunk_bytes: int,
                     progress: Progress = NULL) -> os.stat_result | None:
    """Atomically replace ``target`` with the file a state dict's commit recorded, written from
    ``tensors`` (its tensors by name, wherever they live) and the stored header, if it holds
    the bytes ``entry`` describes; returns its stat, or None with nothing written (a tensor
    changed after the commit read it, or is gone). Decoding it from the store cost as much
    as the commit's own encode (a delta's chain decoded for each chunk)."""
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
            except (OSError, KeyError, TypeError, RuntimeError):  # (a tensor gone, or of another kind)
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


def tensor_bytes(store: ObjectStore, chunks) -> bytearray:
    out = bytearray()
    for raw in store.get_many(chunks):
        out += raw
    return out
