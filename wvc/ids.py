"""Object ids: blake3-256, domain-separated by object kind.

A chunk's id is the hash of its raw content (never of its encoding), so identical content
is stored once whatever its history. Trees and commits are hashed over their canonical
bytes, so the same commit has the same id in every clone. ``derive_key_context`` gives
each kind its own hash function: a chunk can never collide with a tree of equal bytes.
"""

from __future__ import annotations

import re

from blake3 import blake3

ID_HEX_LEN = 64
_ID_RE = re.compile(r"^[0-9a-f]{64}$")

CHUNK = "wvc 2026-11 chunk v1"
TREE = "wvc 2026-11 tree v1"
COMMIT = "wvc 2026-11 commit v1"
FILE = "wvc 2026-11 file v1"  # the bytes of a file (tree format 1)
FILE_LISTING = "wvc 2026-11 file v2"  # a file's chunk list (tree format 2: FileEntry.content_id)
PACK = "wvc 2026-11 pack v1"


def hasher(kind: str, *, all_cores: bool = False) -> blake3:
    """A streaming hasher for ``kind`` (one of the module's context strings).

    One thread by default: commit and checkout already keep every core busy with one
    chunk per worker, and blake3's own thread pool then only competed with them (its idle
    threads spin): a 1 GB delta commit took 1.2x the wall time with it (benchmarks/).
    ``all_cores`` is for hashing that runs alone, such as ``status`` hashing a file.
    """
    return blake3(derive_key_context=kind, max_threads=blake3.AUTO if all_cores else 1)


def digest(kind: str, data) -> str:
    """Hex id of ``data`` (bytes-like) for object kind ``kind``."""
    h = hasher(kind)
    h.update(data)
    return h.hexdigest()


def chunk_id(data) -> str:
    return digest(CHUNK, data)


def is_object_id(value: object) -> bool:
    return isinstance(value, str) and _ID_RE.match(value) is not None


def short(object_id: str, length: int = 12) -> str:
    return object_id[:length]


def cache_name(url: str, length: int) -> str:
    """A local cache folder's (or file's) name for ``url``: its first ``length`` hex digits of
    a digest. Not an object id: the chunk context is used only because the first caches were
    named with it, so that those a user has stay found."""
    return digest(CHUNK, url.encode())[:length]
