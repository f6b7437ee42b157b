"""Many chunks' transforms in a few device passes: the GPU half of a commit from device memory.

:func:`encode_on_device` takes a batch of chunks whose raw bytes and delta bases are on a
torch device and returns their payloads, byte for byte those of
:func:`~wvc.codec.transforms.encode_chunk` on the host. Per chunk the work splits where
each part is cheapest:

- **the choice of method** stays on the host (:func:`~wvc.codec.transforms.chosen_method`:
  trials on four small slices, the bytes the host holds anyway to hash the chunk);
- **the transform, the exponent grouping and the plane split** run on the device, for all
  chunks of one (method, dtype) at once: one concatenation, one transform, one stable sort
  (the key is chunk-major, so each chunk's elements stay in its own range and are sorted
  exactly as the chunk alone would be), one plane split; a SPARSE chunk's nonzero deltas are
  found by one ``nonzero`` over the batch and only they cross to the host;
- **the planes go to the host** in one copy per group (into pinned memory, on the copy
  stream, see :mod:`wvc.codec.device_copy`), where zstd codes them on the codec pool: zstd has no
  device implementation in the given dependencies, so the format is unchanged.

Chunks the device pass does not take (those below MIN_SAMPLED, where the encoder tries every
method in full; the caller routes step-coder candidates to the host coder) are the caller's.
Nothing here touches a store: bytes and tensors in, payloads out.
"""

from __future__ import annotations

from collections import defaultdict
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np

from ..formats.dtypes import DType
from .backends import backend
from .container import ROTATED, Method, compress_stream, pack
from .transforms import (Encoded, _gap_streams, _rotate_left, _transform, inner_method, merge_groups,
                         planes_param)

@dataclass
class DeviceChunk:
    """One chunk of a batch: ``x`` its bytes on the device (a uint8 tensor), ``b`` its delta
    base there (None: a keyframe), ``method`` the one to encode (chosen on the host)."""

    x: object
    b: object | None
    dtype: DType
    method: Method


def _int_dtype(torch, width: int):
    return {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[width]


def encode_on_device(chunks: list[DeviceChunk], *, level: int, submit, copy) -> list[Future]:
    """Futures of each chunk's :class:`Encoded`, in order.

    ``submit(fn)`` runs host work (zstd) on the codec pool and returns a Future; ``copy(t)``
    starts a device-to-host copy of tensor ``t`` and returns a function that waits for it
    and gives a numpy array (:meth:`wvc.codec.device_copy.DeviceCopies.to_host`). The device work
    of every group is queued before the first copy is waited for, so the device runs the
    later groups while the host compresses the earlier ones."""
    import torch

    groups: dict[tuple, list[int]] = defaultdict(list)
    for i, c in enumerate(chunks):
        groups[(c.method, c.dtype.name)].append(i)
    futures: list[Future | None] = [None] * len(chunks)
    launched = []
    for (method, _), members in groups.items():
        launched.append((method, members, _launch(torch, method, [chunks[i] for i in members], copy)))
    for method, members, pending in launched:
        for i, job in zip(members, pending()):
            futures[i] = submit(lambda job=job, method=method: Encoded(job(level), method))
    return futures


def _launch(torch, method: Method, chunks: list[DeviceChunk], copy):
    """Queue one group's device work and copies; returns a function that waits for the copies
    and gives each chunk's payload builder (``builder(level) -> bytes``, host work)."""
    dtype = chunks[0].dtype
    width, bits = dtype.width, dtype.width * 8
    itype = _int_dtype(torch, width)
    counts = [c.x.numel() // width for c in chunks]
    starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    x = torch.cat([c.x.reshape(-1) for c in chunks]).view(itype)
    b = torch.cat([c.b.reshape(-1) for c in chunks]).view(itype) if method.uses_base else None
    if method is Method.SPARSE:
        inner = inner_method(dtype)
        d = _transform(inner, x, b, bits)
        positions = torch.nonzero(d).reshape(-1)
        values = d[positions]
        del x, b, d
        wait_positions, wait_values = copy(positions), copy(values)

        def ready_sparse():
            pos, vals = wait_positions(), wait_values()
            return [_sparse_builder(pos, vals, starts[k], starts[k + 1], width, inner) for k in range(len(chunks))]

        return ready_sparse
    param, sizes, wait_counts = 0, [[n] for n in counts], None
    if method is Method.PLANES and planes_param(dtype) == ROTATED:
        param, y = ROTATED, _rotate_left(x, bits)
    elif method is Method.ULP_EXP:
        param = dtype.exponent[0]
        y = _transform(method, x, b, bits)
        mask = (1 << (bits - 1 - param)) - 1
        # 32-bit keys while they fit (a radix sort's passes, and torch's CPU sort, ~1.5x faster)
        kind = torch.int32 if len(chunks) * (mask + 1) < 1 << 31 else torch.int64
        owner = torch.repeat_interleave(torch.arange(len(chunks), device=x.device, dtype=kind),
                                        torch.tensor(counts, device=x.device), output_size=int(starts[-1]))
        key = ((b >> param) & mask).to(kind) + owner * (mask + 1)
        perm = torch.argsort(key, stable=True)
        per_key = torch.bincount(key, minlength=len(chunks) * (mask + 1)).reshape(len(chunks), mask + 1)
        y = y[perm]
        del owner, key, perm
        wait_counts = copy(per_key)
    else:
        y = _transform(method, x, b, bits)
    del x, b
    planes = y.view(torch.uint8) if width == 1 else y.view(torch.uint8).reshape(-1, width).T.contiguous()
    del y
    wait_planes = copy(planes)

    def ready():
        host = wait_planes().reshape(width, -1)
        if wait_counts is not None:
            table = wait_counts()
            group_sizes = [merge_groups(row.tolist()) for row in table]
        else:
            group_sizes = sizes
        return [_planes_builder(host, starts[k], group_sizes[k], method, width, param, counts[k] * width)
                for k in range(len(chunks))]

    return ready


def _planes_builder(host, start: int, sizes: list[int], method: Method, width: int, param: int, raw_size: int):
    def build(level: int) -> bytes:
        streams, at = [], int(start)
        for n in sizes:
            streams += [compress_stream(host[j, at : at + n], level) for j in range(width)]
            at += n
        return pack(method, width, param, raw_size, streams)

    return build


def _sparse_builder(positions, values, start: int, end: int, width: int, inner: Method):
    def build(level: int) -> bytes:
        lo, hi = np.searchsorted(positions, [start, end])
        pos = positions[lo:hi] - start
        gaps = (np.diff(pos, prepend=-1) - 1).astype(np.uint32)
        streams = [compress_stream(p, level) for p in _gap_streams(gaps)]
        streams += [compress_stream(p, level) for p in backend("cpu").planes(values[lo:hi], width)]
        return pack(Method.SPARSE, width, int(inner), int(end - start) * width, streams)

    return build
