"""Indexing a base model's files: where each chunk lies, so it is read in place."""

from __future__ import annotations

from pathlib import Path

from .. import ids
from ..model.chunk_spans import file_chunks
from ..model.versions import Tree
from ..progress import NULL, Progress
from ..worktree.chunking import TreeBuilder


class _NoStatCache:
    def cached_hash(self, relpath, st, chunk_bytes):
        return None

    def remember(self, relpath, st, chunk_bytes, digest):
        pass


class _LocationRecorder:
    """Stands in for a ChunkWriter: records where each chunk is instead of storing it."""

    def __init__(self):
        self.locations: dict[str, tuple[str, int, int]] = {}

    def put(self, raw, dtype, base_id=None) -> str:
        return ids.chunk_id(raw)

    def locate(self, object_id: str, origin: tuple[str, int], length: int) -> None:
        self.locations.setdefault(object_id, (origin[0], origin[1], length))


def index(root: Path, paths: list[str], chunk_bytes: int, progress: Progress = NULL):
    """(tree, {chunk id: (path, offset, length)}) of the files ``paths`` under ``root``."""
    recorder = _LocationRecorder()
    tree = TreeBuilder(recorder, None, chunk_bytes, progress, recorder.locate).directory(root, sorted(paths),
                                                                                     _NoStatCache())
    return tree, recorder.locations


def chunk_locations(tree: Tree) -> dict[str, tuple[str, int, int]]:
    """Where each chunk of ``tree`` lies in its file, from the tree alone (no file read).

    A safetensors file is 8 length bytes, the header, then the tensors back to back in
    tree order; the header's length is what the tensors leave of the file size.
    """
    out: dict[str, tuple[str, int, int]] = {}
    for f in tree.files:
        for cid, offset, length in file_chunks(f, tree.chunk_bytes):
            out.setdefault(cid, (f.path, offset, length))
    return out
