"""Tell glibc's malloc to keep chunk-sized buffers mapped between chunks.

Every chunk passes through several fresh buffers of its size (the bytes read, the planes,
the decoded parent, zstd's output). glibc serves these from its per-thread arenas and, by
default, hands freed memory at an arena's top back to the kernel once more than ~8 MiB
is free; the next chunk then faults every page in again, zeroed. On the 1 GB benchmark
commit that was 560k page faults, a fifth of the CPU time (sys 1.4 s of 6.4 s).

Raising the trim threshold to 64 MiB and fixing the mmap threshold at 16 MiB keeps those
buffers in the arenas, at a cost of at most 64 MiB of freed memory held per arena. Only
glibc has ``mallopt``; elsewhere this does nothing. It changes the whole process (the
contract says so, docs/architecture.md "Process-wide changes"); ``WVC_MALLOC_TUNING=0`` leaves
malloc alone.
"""

from __future__ import annotations

import logging
import sys

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1  # glibc's <malloc.h>
M_MMAP_THRESHOLD = -3
TRIM_THRESHOLD = 64 << 20
MMAP_THRESHOLD = 16 << 20  # above the largest chunk (4 MiB by default) and its planes

_applied: bool | None = None  # None: not tried yet


def keep_chunk_buffers() -> bool:
    """Apply the thresholds once per process; True when glibc took them."""
    global _applied
    if _applied is None:
        _applied = _apply()
    return _applied


def _apply() -> bool:
    from .. import settings

    if not sys.platform.startswith("linux") or not settings.switch("WVC_MALLOC_TUNING", True):
        return False
    import ctypes  # here: commands that encode nothing never load it

    try:
        mallopt = ctypes.CDLL(None).mallopt  # the symbols already loaded: libc's
    except (OSError, AttributeError) as exc:  # musl and others: no mallopt
        log.debug("malloc left as it is: no mallopt (%s)", exc)
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)) and bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))
