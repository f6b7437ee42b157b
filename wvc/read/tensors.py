"""Tensors out of a version: ``load_state_dict``, eager or lazy (decoded on access)."""

from __future__ import annotations

from collections.abc import Mapping

from ..codec.devices import resolve_device
from ..errors import CorruptObject
from ..formats.dtypes import DTYPES
from ..worktree.materialize import tensor_bytes


def tensor_from_chunks(store, entry, device: str):
    """A tensor entry's chunks (from anything with ``get_many``) as a torch tensor on ``device``."""
    import torch

    if device != "cpu":
        return tensors_on_device(store, {entry.name: entry}, device)[entry.name]
    dtype = getattr(torch, DTYPES[entry.dtype].torch_name)
    raw = tensor_bytes(store, entry.chunks)
    if not raw:
        return torch.empty(entry.shape, dtype=dtype)
    return torch.frombuffer(raw, dtype=torch.uint8).view(dtype).reshape(entry.shape)


def _spans(chunks, count: int, size: int):
    """(offset, raw) for the next ``count`` chunks of ``chunks`` (an iterator of their bytes,
    in order), which must fill ``size`` bytes exactly: a tensor's chunks are its bytes."""
    at = 0
    for _ in range(count):
        raw = next(chunks)
        if at + len(raw) > size:
            raise CorruptObject("a tensor's chunks hold more bytes than its shape")
        yield at, raw
        at += len(raw)
    if at != size:
        raise CorruptObject("a tensor's chunks hold fewer bytes than its shape")


def _empty_tensor(entry, device: str = "cpu"):
    import torch

    return torch.empty(tuple(entry.shape), dtype=getattr(torch, DTYPES[entry.dtype].torch_name), device=device)


def _placed(store, flats: list):
    """(where, raw) for every chunk of ``flats`` ((a tensor's bytes as a flat uint8 tensor, its
    chunk ids), in order): one ``get_many`` over them all, so the codec pool decodes ahead
    across tensors (a model of many one-chunk tensors decodes in parallel, not a tensor at a
    time)."""
    chunks = store.get_many([c for _, ids in flats for c in ids])
    for flat, ids in flats:
        for at, raw in _spans(chunks, len(ids), flat.numel()):
            yield flat[at : at + len(raw)], raw


def _empty(entries: dict, device: str) -> tuple[dict, list]:
    import torch

    out, flats = {}, []
    for name, e in entries.items():
        t = out[name] = _empty_tensor(e, device)
        flats.append((t.reshape(-1).view(torch.uint8), e.chunks))
    return out, flats


def stream_tensors(store, entries):
    """Each of ``entries``' tensors in host memory, in order: their chunks decoded ahead on the
    codec pool across tensors (every chunk hash-checked), what is held at once bounded by the
    pool's in-flight bytes and the tensor being filled. Each tensor's chunks must fill it."""
    import numpy as np
    import torch

    chunks = store.get_many([c for e in entries for c in e.chunks])
    for e in entries:
        t = _empty_tensor(e)
        flat = t.reshape(-1).view(torch.uint8).numpy()
        for at, raw in _spans(chunks, len(e.chunks), flat.size):
            flat[at : at + len(raw)] = np.frombuffer(raw, dtype=np.uint8)
        yield t


def tensors_on_host(store, entries: dict) -> dict:
    """Tensor entries decoded into tensors in host memory (:func:`stream_tensors`)."""
    return dict(zip(entries, stream_tensors(store, list(entries.values()))))


def tensors_on_device(store, entries: dict, device: str, batch_bytes: int | None = None) -> dict:
    """Tensor entries decoded on the host (every chunk hash-checked, decoded ahead on the
    codec pool) and copied to ``device`` a batch at a time, through pinned memory and the
    copy stream (wvc/codec/device_copy.py): a copy per chunk, not one per tensor through pageable
    memory, and the host decodes the next chunks while a batch crosses."""
    from ..codec.device_copy import DeviceCopies
    from ..codec.pool import pool

    copies = DeviceCopies(device, batch_bytes)
    out, flats = _empty(entries, device)
    batch, parts, size = [], [], 0
    for where, raw in _placed(store, flats):
        batch.append(where)
        parts.append(raw)
        size += len(raw)
        if size >= copies.batch_bytes:
            copies.into(batch, parts, pool().map)
            batch, parts, size = [], [], 0
    if batch:
        copies.into(batch, parts, pool().map)
    return out


class LazyStateDict(Mapping):
    """A read-only mapping that decodes a tensor only when it is looked up."""

    def __init__(self, repo, entries: dict, device: str):
        self._repo, self._entries, self._device = repo, entries, device

    def __getitem__(self, name):
        return tensor_from_chunks(self._repo.store, self._entries[name], self._device)

    def __iter__(self):
        return iter(self._entries)

    def __len__(self):
        return len(self._entries)


def load_state_dict(repo, rev: str = "HEAD", *, device: str = "cpu", lazy: bool = False):
    """Every tensor of every safetensors file of ``rev`` (shards merged), by name."""
    device = resolve_device(device, allow_test_backend=False)
    tree = repo.tree_of(rev)
    entries = {}
    for f in tree.files:
        for t in f.tensors:
            entries.setdefault(t.name, t)
    if lazy:
        return LazyStateDict(repo, entries, device)
    repo.store.ensure_local(c for e in entries.values() for c in e.chunks)
    if device != "cpu":  # many tensors a copy
        return tensors_on_device(repo.store, entries, device)
    return tensors_on_host(repo.store, entries)
