"""Tensors out of a version: ``load_state_dict``, eager or lazy (decoded on access)."""

from __future__ import annotations

from collections.abc import Mapping

from ..codec.devices import resolve_device
from ..formats.dtypes import DTYPES
from .materialize import tensor_bytes


def tensor_from_chunks(store, entry, device: str):
    """A tensor entry's chunks (from anything with ``get_many``) as a torch tensor on ``device``."""
    import torch

    dtype = getattr(torch, DTYPES[entry.dtype].torch_name)
    raw = tensor_bytes(store, entry.chunks)
    if not raw:
        return torch.empty(entry.shape, dtype=dtype, device=device)
    t = torch.frombuffer(raw, dtype=torch.uint8).view(dtype).reshape(entry.shape)
    return t.to(device) if device != "cpu" else t


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
    return {name: tensor_from_chunks(repo.store, e, device) for name, e in entries.items()}
