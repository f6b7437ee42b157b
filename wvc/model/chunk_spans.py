"""How a file lays out as chunks: the one place that says which bytes of a file each chunk
of its tree entry covers.

- A blob is cut into ``chunk_bytes`` pieces.
- A safetensors file is its 8-byte little-endian header length, the header (one chunk,
  exactly as in the file, padding included), then each tensor's bytes in tree order, each
  tensor cut into element-aligned chunks (:func:`chunk_spans`): chunk *i* of a tensor always
  covers the same elements, so it lines up with chunk *i* of the same tensor in the parent
  commit, which is what makes per-chunk deltas work.

Writers (worktree/chunking.py, integrations/dcp.py), readers that rebuild files or tensors
(worktree/materialize.py, read/follower.py), the working-tree hash (worktree/scan.py) and a base model's
index (basemodel/index.py) all cut files through these functions.
"""

from __future__ import annotations

from ..errors import CorruptObject
from ..formats.dtypes import DTYPES

SAFETENSORS_PREFIX = 8  # the header's length, u64 little-endian, before the header


def chunk_spans(nbytes: int, width: int, chunk_bytes: int) -> list[tuple[int, int]]:
    """Element-aligned ``[begin, end)`` byte spans of a tensor or blob of ``nbytes``."""
    step = max(width, chunk_bytes - chunk_bytes % width)
    return [(b, min(b + step, nbytes)) for b in range(0, nbytes, step)]


def tensor_spans(entry, chunk_bytes: int) -> list[tuple[int, int]]:
    """The spans of a tree's tensor entry (its dtype's width, its byte size)."""
    return chunk_spans(entry.nbytes, DTYPES[entry.dtype].width, chunk_bytes)


def file_chunks(entry, chunk_bytes: int) -> list[tuple[str, int, int]]:
    """(chunk id, offset in the file, length) of each chunk of a tree's file entry, from the
    entry alone: a safetensors header's length is what the tensors leave of the file size."""
    if entry.kind == "blob":
        return [(cid, b, e - b) for cid, (b, e) in zip(entry.chunks, chunk_spans(entry.size, 1, chunk_bytes))]
    sizes = []
    for t in entry.tensors:
        if t.dtype not in DTYPES:
            raise CorruptObject(f"{entry.path}: unknown dtype {t.dtype!r}")
        sizes.append(t.nbytes)
    cursor = entry.size - sum(sizes)
    if cursor < SAFETENSORS_PREFIX:
        raise CorruptObject(f"{entry.path}: tensors larger than the file")
    out = [(entry.header, SAFETENSORS_PREFIX, cursor - SAFETENSORS_PREFIX)]
    for t, nbytes in zip(entry.tensors, sizes):
        out += [(cid, cursor + b, e - b) for cid, (b, e) in zip(t.chunks, tensor_spans(t, chunk_bytes))]
        cursor += nbytes
    return out
