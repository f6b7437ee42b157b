"""Step records: what a follower needs to move from a commit to its child, in one small read.

A follower holding commit B moves to its child C by reading ``steps/<C>.step`` (the name
comes from the ref it polls: no listing, no catalog). The record carries C's commit bytes,
C's tree as a diff of B's (the chunk ids that changed, at their places; the format also
allows the whole tree) and, for every chunk that changed, where its payload is
as a delta against the chunk B held at that place: a range of a pack, when the stored
payload already is that delta (its step context, if it has one, being the chunk the
version before B held there), else a **step payload** carried in the record itself: the
chunk coded against B's chunk, with an explicit context. So a follower's bytes a step are
that step's change, whatever the anchor policy stored (a re-anchored chunk's stored payload
carries the drift since its anchor), and its cost does not grow with the history (no
catalog is read). Records are an optimisation: a push keeps the newest ``KEEP`` of a
branch (older ones are replaced like compacted files), and a follower that finds none, or
one it cannot use, reads the version the ordinary way. Every byte of a record is checked
before use: the commit against its id, the tree against the commit, each chunk against
its id.

File: ``b"WVCSTEP\\x01\\n"``, u64 length of the header, the header (a zstd frame of
canonical JSON, below), then the data area: the commit's bytes, the tree's bytes (when not
a diff) and the step payloads, back to back::

    {"commit": id, "parent": id, "commit_bytes": [offset, length], "tree_bytes": [offset, length] | null,
     "tree_diff": [[path, tensor name | null, chunk index, chunk id], ...] | null,
     "chunks": [[id, base | null, context | null, raw size, pack | null, offset, length], ...]}

A chunk's ``pack`` names the remote pack holding the payload at ``offset``; null means the
data area. A null ``base``: the stored payload is a keyframe (the anchor policy writes one only
when it beats every delta), which decodes alone.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass

from .. import ids
from ..errors import CorruptObject, FormatError
from ..formats import bounded_json
from ..model.tree_diff import check_changes
from .interface import Handle
from ..model.versions import MAX_PAYLOAD, MAX_RAW_CHUNK, MAX_TREE_BYTES, canonical_json

MAGIC = b"WVCSTEP\x01\n"
KEEP = 8  # records a push keeps of its branch: the newest first-parent steps
MAX_HEADER = 64 << 20  # decompressed
MAX_RECORD = 4 << 30  # a step of a very large model carries its re-anchored chunks' step payloads
MAX_CHUNKS = 1 << 20


@dataclass(frozen=True)
class StepChunk:
    id: str
    base: str | None  # None: a keyframe
    context: str | None
    raw_size: int
    pack: str | None  # None: the payload is in the record
    offset: int
    length: int

    def to_json(self):
        return [self.id, self.base, self.context, self.raw_size, self.pack, self.offset, self.length]


@dataclass
class StepRecord:
    commit: str
    parent: str
    commit_bytes: bytes
    tree_bytes: bytes | None  # the whole tree, or None with ``tree_diff``
    tree_diff: list | None  # [path, tensor name | None, index, chunk id]
    chunks: list[StepChunk]
    data: "bytes | memoryview | _Ranges" = b""  # the data area (step payloads), or where to read it
    header_bytes: int = 0  # its header's size, decompressed (what parsing it may hold: bounded_json)

    def payload(self, chunk: StepChunk) -> bytes:
        if isinstance(self.data, _Ranges):
            return self.data.read(chunk.offset, chunk.length)
        return bytes(self.data[chunk.offset : chunk.offset + chunk.length])

    def data_path(self) -> tuple[str, int] | None:
        """(the record's remote path, where its data area starts) when payloads are read from
        the remote as needed, else None (the record was read whole)."""
        return (self.data.handle, self.data.start) if isinstance(self.data, _Ranges) else None


def stored_payload(backend, chunk: StepChunk) -> bytes:
    """A record's chunk whose payload is a stored one (``chunk.pack``), read by range."""
    return backend.read_range(Handle("pack", chunk.pack), chunk.offset, chunk.length)


class _Ranges:
    """A large record's data area left on the remote: each payload is a range read of it."""

    def __init__(self, backend, handle: Handle, start: int):
        self.backend, self.handle, self.start = backend, handle, start

    def read(self, offset: int, length: int) -> bytes:
        return self.backend.read_range(self.handle, self.start + offset, length)


# A record up to this size is read whole, in one request (a step's record is small: its
# change's payloads); a larger one (a re-anchor of a large model's every chunk, or a hostile
# remote's 4 GiB) is read as its header, then each payload's range as it is decoded: a
# follower's memory holds the header and the payloads in flight, never the file.
WHOLE_READ = 16 << 20


def fetch(backend, commit_id: str) -> StepRecord | None:
    """``commit_id``'s record from ``backend`` (None: there is none), parsed; CorruptObject
    if it is not a valid record."""
    from ..errors import RemoteFileTooLarge

    handle = Handle("step", commit_id)
    try:
        data = backend.read(handle, WHOLE_READ)
    except RemoteFileTooLarge:
        return _fetch_ranges(backend, handle, commit_id)
    return None if data is None else parse(data, commit_id)


def _fetch_ranges(backend, handle: Handle, commit_id: str) -> StepRecord:
    from ..model.versions import Commit

    import zstandard

    try:
        prefix = backend.read_range(handle, 0, len(MAGIC) + 8)
        if prefix[: len(MAGIC)] != MAGIC:
            raise ValueError("not a step record")
        (head_len,) = struct.unpack_from("<Q", prefix, len(MAGIC))
        if head_len > MAX_HEADER + (1 << 20):  # a frame of at most MAX_HEADER bytes is no larger than this
            raise ValueError("header larger than allowed")
        frame = backend.read_range(handle, len(prefix), head_len)
        return _parse(frame, commit_id, Commit, area=_Ranges(backend, handle, len(prefix) + head_len))
    except (FormatError, ValueError, TypeError, KeyError, IndexError, RecursionError, struct.error,
            zstandard.ZstdError) as exc:
        raise CorruptObject(f"step record of {ids.short(commit_id)} is malformed: {exc}") from exc


def build(commit: str, parent: str, commit_bytes: bytes, tree_bytes: bytes | None, tree_diff: list | None,
          chunks: list[tuple[str, str, str | None, int, str | None, int, int, bytes | None]]) -> bytes:
    """A record's bytes. ``chunks``: (id, base, context, raw size, pack, offset, length,
    payload): a payload (pack None) goes into the data area and its offset is set here."""
    import zstandard

    area = [commit_bytes]
    at = len(commit_bytes)
    tree_at = None
    if tree_bytes is not None:
        tree_at = [at, len(tree_bytes)]
        area.append(tree_bytes)
        at += len(tree_bytes)
    listed = []
    for cid, base, context, raw_size, pack, offset, length, payload in chunks:
        if pack is None:
            offset, length = at, len(payload)
            area.append(payload)
            at += length
        listed.append([cid, base, context, raw_size, pack, offset, length])
    header = canonical_json({"commit": commit, "parent": parent, "commit_bytes": [0, len(commit_bytes)],
                             "tree_bytes": tree_at, "tree_diff": tree_diff, "chunks": listed})
    head = zstandard.ZstdCompressor(level=3).compress(header)
    return b"".join([MAGIC, struct.pack("<Q", len(head)), head, *area])


def parse(data: bytes, commit_id: str) -> StepRecord:
    """A record read from a remote (untrusted): every field bounded and typed; the commit
    bytes checked against ``commit_id``. Raises CorruptObject."""
    from ..model.versions import Commit

    import zstandard

    try:
        return _parse(data, commit_id, Commit)
    except (FormatError, ValueError, TypeError, KeyError, IndexError, RecursionError, struct.error,
            zstandard.ZstdError) as exc:
        raise CorruptObject(f"step record of {ids.short(commit_id)} is malformed: {exc}") from exc


def _parse(data: bytes, commit_id: str, Commit, area: _Ranges | None = None) -> StepRecord:
    """``data``: the whole record; or, with ``area`` (the data area left on the remote), its
    header's zstd frame."""
    import zstandard

    if area is None:
        if len(data) < len(MAGIC) + 8 or data[: len(MAGIC)] != MAGIC:
            raise ValueError("not a step record")
        (head_len,) = struct.unpack_from("<Q", data, len(MAGIC))
        start = len(MAGIC) + 8
        if head_len > len(data) - start:
            raise ValueError("header runs past the end")
        frame = bytes(data[start : start + head_len])
    else:
        frame, start, head_len = bytes(data), 0, len(data)
    declared = zstandard.frame_content_size(frame)
    if not 0 <= declared <= MAX_HEADER:  # the writer declares it; a bomb is refused unread
        raise ValueError("header size undeclared or too large")
    header = zstandard.ZstdDecompressor().decompress(frame, max_output_size=declared)
    raw = bounded_json.loads(header, f"step record of {ids.short(commit_id)}")
    if not isinstance(raw, dict) or set(raw) != {"commit", "parent", "commit_bytes", "tree_bytes", "tree_diff", "chunks"}:
        raise ValueError("unexpected header fields")
    if area is None:
        area = memoryview(data)[start + head_len :]
        size = len(area)
    else:
        size = None  # (a range past the end fails when it is read)
    if raw["commit"] != commit_id or not ids.is_object_id(raw["parent"]):
        raise ValueError("names another commit")

    def span(value, limit: int) -> tuple[int, int]:
        offset, length = value
        if type(offset) is not int or type(length) is not int or offset < 0 or not 0 <= length <= limit \
                or (size is not None and offset + length > size):
            raise ValueError("a range out of bounds")
        return offset, length

    def read(o: int, n: int) -> bytes:
        return area.read(o, n) if isinstance(area, _Ranges) else bytes(area[o : o + n])

    o, n = span(raw["commit_bytes"], 1 << 24)
    commit_bytes = read(o, n)
    commit = Commit.from_bytes(commit_bytes, commit_id)
    if not commit.parents or commit.parents[0] != raw["parent"]:
        raise ValueError("its parent is not the commit's first parent")
    tree_bytes = tree_diff = None
    if raw["tree_bytes"] is not None:
        o, n = span(raw["tree_bytes"], MAX_TREE_BYTES)
        tree_bytes = read(o, n)
    else:
        tree_diff = check_changes(raw["tree_diff"], MAX_CHUNKS)
    chunks = []
    if not isinstance(raw["chunks"], list) or len(raw["chunks"]) > MAX_CHUNKS:
        raise ValueError("bad chunk list")
    for cid, base, context, raw_size, pack, offset, length in raw["chunks"]:
        if not (ids.is_object_id(cid) and (base is None or ids.is_object_id(base))
                and (context is None or (base is not None and ids.is_object_id(context)))):
            raise ValueError("bad chunk id")
        if type(raw_size) is not int or not 0 <= raw_size <= MAX_RAW_CHUNK:
            raise ValueError("bad raw size")
        if pack is None:
            offset, length = span([offset, length], MAX_PAYLOAD)
        elif not ids.is_object_id(pack) or type(offset) is not int or type(length) is not int \
                or offset < 0 or not 0 < length <= MAX_PAYLOAD:
            raise ValueError("bad pack range")
        chunks.append(StepChunk(cid, base, context, raw_size, pack, offset, length))
    return StepRecord(commit_id, raw["parent"], commit_bytes, tree_bytes, tree_diff, chunks, area, len(header))
