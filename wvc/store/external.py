"""External objects: chunks of a base model, read in place from the base's own files.

A repository made with ``wvc init --base`` indexes the base's files once: each chunk id
maps to (path inside the base directory, offset, length). The bytes stay where they are
(the huggingface_hub cache, or a local directory) and are never copied into ``.wvc/`` nor
pushed. Every read is checked against the chunk id, so a base file that changed since it
was indexed is reported, never used.

This module knows nothing about where the base directory is: the repository passes a
``locate`` callable (ops/base.py finds or downloads the base).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

from .. import ids
from ..errors import CorruptObject, MissingObject
from ..fsutil import validate_relpath

BASE_PACK = ":base"  # ObjectRow.pack of an external object: it lives in no pack
EXTERNAL_METHOD = -1  # ObjectRow.method: raw bytes in a base file


class ExternalFiles:
    def __init__(self, locate: Callable[[], Path]):
        self._locate = locate
        self._root: Path | None = None
        self._lock = threading.Lock()

    def root(self) -> Path:
        """Located once per process and kept: reads run on worker threads."""
        with self._lock:
            if self._root is None:
                self._root = self._locate()
            return self._root

    def read(self, object_id: str, path: str, offset: int, length: int, *, verify: bool = True) -> bytes:
        """The chunk's bytes from the base file, hash-verified unless ``verify`` is False (the
        caller then checks something derived from them: see ObjectStore.decode_chain)."""
        root = self.root()
        full = root.joinpath(*validate_relpath(path).split("/"))
        try:
            with open(full, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                fh.seek(offset)
                raw = fh.read(length)
        except FileNotFoundError as exc:
            raise MissingObject(f"base file {path} is missing from {root}") from exc
        if len(raw) != length:
            raise CorruptObject(f"base file {path} changed since the base was recorded (now {size} bytes)")
        if verify and ids.chunk_id(raw) != object_id:
            raise CorruptObject(f"base file {path} changed since the base was recorded "
                                f"(bytes at {offset} fail the check of chunk {ids.short(object_id)})")
        return raw
