"""One host copy of the checkpoint for all the workers of a server, in shared memory.

The leader of a server's workers (server_group.py) creates a file in ``/dev/shm`` the size
of the checkpoint's tensors, reserves its pages (so that a full ``/dev/shm`` fails here, with
an error, not later with a SIGBUS on first touch), and every worker maps it; once all have, the
leader unlinks it, so the memory goes when the last worker does, however it ends. Each
checkpoint tensor is a view at its own 64-byte-aligned offset. Only the leader's follower writes
it (between updates: no worker returns from one before all have written it); the others read
their shards from it when they write their engine's.
"""

from __future__ import annotations

import logging
import math
import mmap
import os
import tempfile
import warnings
from pathlib import Path

from ...formats.dtypes import DTYPES

log = logging.getLogger(__name__)

SHM_DIR = Path("/dev/shm")
ALIGN = 64


def _spans(layout: dict) -> tuple[dict, int]:
    """name -> (offset, bytes) for each tensor of ``layout`` ((dtype name, shape) by name),
    and the total size."""
    spans, at = {}, 0
    for name in sorted(layout):
        dtype, shape = layout[name]
        size = math.prod(int(n) for n in shape) * DTYPES[dtype].width
        spans[name] = (at, size)
        at += (size + ALIGN - 1) // ALIGN * ALIGN
    return spans, at


class SharedHostCopy:
    """The checkpoint's tensors (``tensors``, by name) in one shared mapping."""

    def __init__(self, mapping: mmap.mmap, layout: dict, name: str):
        import torch

        self._mapping, self.name = mapping, name
        self.tensors: dict = {}
        spans, _ = _spans(layout)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (frombuffer on an mmap: writable, no copy)
            for tensor, (offset, size) in spans.items():
                dtype, shape = layout[tensor]
                kind = getattr(torch, DTYPES[dtype].torch_name)
                if size == 0:
                    self.tensors[tensor] = torch.empty(tuple(shape), dtype=kind)
                    continue
                flat = torch.frombuffer(mapping, dtype=torch.uint8, count=size, offset=offset)
                self.tensors[tensor] = flat.view(kind).view(tuple(shape))

    def fill(self, files) -> None:
        """Read the checkpoint ``files`` (safetensors) into the tensors, one at a time."""
        for path in files:
            read_checkpoint(Path(path), lambda t: self.tensors.get(t.name))


def read_checkpoint(path: Path, target) -> None:
    """Read each tensor of the safetensors file ``path`` into ``target(TensorInfo)`` (a host
    tensor of its dtype and shape, or None: skipped) by plain reads, never mapping the file:
    a tensor of a private mapping faults in and copies each page on its first write."""
    import torch

    from ...formats.safetensors import read_header, read_tensor_into

    with open(path, "rb", buffering=0) as fh:
        header = read_header(fh, os.fstat(fh.fileno()).st_size, str(path))
        for t in header.tensors:
            out = target(t)
            if out is not None:
                read_tensor_into(fh, header, t, memoryview(out.reshape(-1).view(torch.uint8).numpy()), str(path))


def _create(size: int) -> tuple[str, mmap.mmap]:
    """A new file in SHM_DIR of ``size`` bytes, its pages reserved, mapped."""
    fd, path = tempfile.mkstemp(prefix="wvc-host-", dir=SHM_DIR)
    try:
        os.posix_fallocate(fd, 0, max(size, 1))
        return path, mmap.mmap(fd, max(size, 1))
    except BaseException:
        os.unlink(path)
        raise
    finally:
        os.close(fd)


def _open(path: str, size: int) -> mmap.mmap:
    fd = os.open(path, os.O_RDWR)
    try:
        if os.fstat(fd).st_size != max(size, 1):
            raise OSError(f"{path} is not the leader's host copy (its size differs)")
        return mmap.mmap(fd, max(size, 1))
    finally:
        os.close(fd)


def allocate(layout: dict, group) -> SharedHostCopy | None:
    """The group's shared host copy of a checkpoint of ``layout`` ((dtype name, shape) by
    name), zero-filled; None on every worker when any of them could not map it (the workers
    then follow alone). A collective over ``group`` (server_group.ServerGroup)."""
    _, size = _spans(layout)
    created, copy, problem = None, None, None
    if group.leads:
        try:
            created, mapping = _create(size)
            copy = SharedHostCopy(mapping, layout, os.path.basename(created))
        except Exception as exc:  # noqa: BLE001 - (no /dev/shm, or too small: ENOSPC here, not SIGBUS later)
            problem = f"no shared memory for the host copy ({size} bytes in {SHM_DIR}): {exc}"
    path = group.broadcast(created if copy is not None else None)
    if path is not None and not group.leads:
        try:
            copy = SharedHostCopy(_open(path, size), layout, os.path.basename(path))
        except Exception as exc:  # noqa: BLE001 - every worker must reach the gather below
            problem = f"the leader's host copy could not be mapped: {exc}"
    problems = group.gather(problem)  # (every worker answers, whatever happened to it)
    if created is not None:
        os.unlink(created)  # every worker has mapped it (or given up): the memory goes with the last of them
    failed = [p for p in problems if p]
    if failed or path is None:
        if group.leads:
            log.warning("wvc: each worker keeps a host copy of its own: %s", failed[0] if failed else "unknown")
        return None
    return copy
