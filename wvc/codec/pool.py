"""The codec thread pools: sized to the CPUs the process may use; zstd, blake3 and the C
kernels release the GIL, so threads scale. Small chunks are coded several to a task
(:class:`SmallTasks`), since a hand-off to a worker cost more than their coding.

Work a caller does not wait for (a trainer's background sync, a server's fetch while it
serves) runs at a lower CPU priority: a thread that calls :func:`work_in_background` is
niced (Linux nice is per thread) and its codec work goes to a second pool of niced threads.
Where they compete for cores, the training step or the generation beside them comes first;
idle cores still do all of it. On 2 cores, a trainer's snapshot was slowed 3-10x by the
sync it had queued the step before.

Callers read ``pool()`` and the sizes through this module at call time (tests set them)."""

from __future__ import annotations

import os
import sys
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
_BACKGROUND_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


class _ThreadKind(threading.local):
    """Per thread: whether it does background work (niced, codec work on the niced pool)."""

    def __init__(self):
        self.low_priority = False


_THREAD = _ThreadKind()


def background_nice() -> int:
    """How many nice steps background work runs below the process (``WVC_BACKGROUND_NICE``,
    0 to 19; default 10: a tenth of a normal thread's share of a contended core)."""
    value = settings.text("WVC_BACKGROUND_NICE")
    if value is None:
        return 10
    if not value.isdigit() or int(value) > 19:
        raise ValueError(f"WVC_BACKGROUND_NICE must be 0 to 19, not {value!r}")
    return int(value)


def _lower_this_thread() -> None:
    """The calling thread niced ``background_nice()`` below the main thread (once: a thread
    made by a background thread inherits its nice value); nothing where threads have no
    nice value of their own (not Linux) or it cannot be set."""
    steps = background_nice()
    if not steps or not sys.platform.startswith("linux"):
        return
    try:
        me = threading.get_native_id()
        target = min(19, os.getpriority(os.PRIO_PROCESS, os.getpid()) + steps)  # (the main thread's id is the pid)
        if os.getpriority(os.PRIO_PROCESS, me) < target:
            os.setpriority(os.PRIO_PROCESS, me, target)
    except OSError:  # (a sandbox that refuses it: the work runs as before)
        pass


def work_in_background() -> None:
    """Mark the calling thread as background work for the rest of its life: it is niced, and
    its codec work (``pool()``) goes to the niced pool (whose threads start with this). For
    threads wvc starts for work no one waits on (a sync queue's worker, a Publisher's
    committer and pusher, a server's prefetch): a thread that later does foreground work
    must not call it (a thread cannot take a lower nice value back without privilege)."""
    if not _THREAD.low_priority:
        _THREAD.low_priority = True
        _lower_this_thread()


def in_background() -> bool:
    return _THREAD.low_priority


def pool() -> ThreadPoolExecutor:
    """The process-wide pool of the calling thread's kind (see the module docstring)."""
    global _POOL, _BACKGROUND_POOL
    with _POOL_LOCK:
        if in_background():
            if _BACKGROUND_POOL is None:
                allocator.keep_chunk_buffers()  # chunk-sized buffers: no page faults per chunk
                _BACKGROUND_POOL = ThreadPoolExecutor(WORKERS, thread_name_prefix="wvc-codec-bg",
                                                      initializer=work_in_background)
            return _BACKGROUND_POOL
        if _POOL is None:
            allocator.keep_chunk_buffers()
            _POOL = ThreadPoolExecutor(WORKERS, thread_name_prefix="wvc-codec")
        return _POOL
