"""The codec thread pool: one per process, sized to the CPUs the process may use; zstd,
blake3 and the C kernels release the GIL, so threads scale. Small chunks are coded several
to a task (:class:`SmallTasks`), since a hand-off to a worker cost more than their coding.

Callers read ``pool()`` and the sizes through this module at call time (tests set them)."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

from . import allocator
from .. import settings


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity (``taskset``, a container's cpuset, a
    launcher's pinning of ranks), not the machine's count, which a 2-CPU pod on a 64-core
    host would read as 64."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # (not Linux)
        return os.cpu_count() or 1


def _codec_threads() -> int:
    """The codec pool's size: the usable CPUs, at most 4 (each thread holds ~5 chunk-sized
    buffers, and 2 x threads x 4 MiB may be in flight); ``WVC_CODEC_THREADS`` sets it (1 to
    64), so a machine with more cores can be measured with more (benchmarks/speed.py's 1-
    and 2-core runs show the scaling on two)."""
    value = settings.text("WVC_CODEC_THREADS")
    if value and value.isdigit() and 1 <= int(value) <= 64:
        return int(value)
    return max(1, min(4, usable_cpus()))


WORKERS = _codec_threads()
# How far ahead of the caller the pool works: at most IN_FLIGHT_BYTES of raw chunks (which
# bounds memory) and at most MAX_IN_FLIGHT chunks. A bound in bytes rather than in chunks:
# results are taken in order, and with a count bound one big chunk at the head stalled the
# pool behind it once a few small ones (biases, norms) had filled the window.
IN_FLIGHT_BYTES = 2 * WORKERS * (4 << 20)
MAX_IN_FLIGHT = 64
# Chunks under SMALL_CHUNK bytes (biases, norms) are coded SMALL_PER_TASK to a pool task:
# one each cost a hand-off to a worker and back, whose wake-ups and context switches took
# more CPU than coding the chunk (a commit of 3,000 768-byte tensors: a fifth of its time).
SMALL_CHUNK = 64 * 1024
SMALL_PER_TASK = 32


class _Share:
    """One chunk's result in a pool task that codes several small chunks in turn."""

    __slots__ = ("future", "index")

    def __init__(self, future, index: int):
        self.future, self.index = future, index

    def result(self):
        return self.future.result()[self.index]

    def cancel(self) -> bool:
        return self.future.cancel()


def _each(fn, items) -> list:
    return [fn(*args) for args in items]


class SmallTasks:
    """Collects consecutive small chunks' work into tasks of up to SMALL_PER_TASK; ``flush``
    submits what is collected and hands each chunk its :class:`_Share`, in order."""

    def __init__(self, fn, on_share):
        self.fn, self.on_share, self.items, self.keys = fn, on_share, [], []

    def add(self, key, args) -> None:
        self.items.append(args)
        self.keys.append(key)
        if len(self.items) >= SMALL_PER_TASK:
            self.flush()

    def flush(self) -> None:
        if not self.items:
            return
        future = pool().submit(_each, self.fn, self.items)
        for k, key in enumerate(self.keys):
            self.on_share(key, _Share(future, k))
        self.items, self.keys = [], []


_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def pool() -> ThreadPoolExecutor:
    """One process-wide pool: zstd, blake3 and numpy release the GIL, so threads scale."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            allocator.keep_chunk_buffers()  # chunk-sized buffers: no page faults per chunk
            _POOL = ThreadPoolExecutor(WORKERS, thread_name_prefix="wvc-codec")
        return _POOL
