"""Pack files: immutable, self-describing files of encoded objects.

Layout::

    b"WVCPACK\\x01"
    payloads, back to back
    index: canonical JSON list of {id, offset, length, raw_size, method, base}
    trailer: u64 index offset, u64 index length, 32-byte blake3 (PACK context) of every
             byte before the trailer, b"WVCPEND\\x01"

A pack is named by that checksum (``pack-<hex>.pack``), so a pack is write-once and a
damaged pack is detectable on its own, without the database. A pack becomes visible only
by rename after fsync; until its rows are committed to the database it is garbage that
``gc`` may remove after a grace period.
"""

from __future__ import annotations

import logging
import mmap
import os
import struct
import tempfile
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path

from .. import ids
from ..errors import CorruptObject, PackMissing
from ..formats import bounded_json
from ..fsutil import PACK_WRITEBACK_BYTES, TEMP_PREFIX, EarlyWriteback, claim_temp, file_mode, fsync_dir
from ..model.versions import MAX_PAYLOAD, MAX_RAW_CHUNK, canonical_json

log = logging.getLogger(__name__)

MAGIC = b"WVCPACK\x01"
END = b"WVCPEND\x01"
_TRAILER = struct.Struct("<QQ32s8s")
# Written between a pack's payloads and its index (dead bytes no entry points into): 64 bytes
# whose gear hash, as Xet's content-defined chunker computes it over its 64-byte window
# (xet-core's Chunker: gearhash's default table, a 64 KiB target, so the top 16 bits), is 0.
# The chunker therefore ends a chunk right after them (whenever the chunk is at least its
# 8 KiB minimum), and a merged pack that copies a pack's bytes up to here (compaction.py)
# cuts the same chunks at the same places as the pack did: Xet deduplicates all of them,
# where before a small pack's one chunk (which ran on into its index) was sent again whole.
# Found by trying counters after the text; nothing reads it, so it costs 64 bytes a pack.
XET_BOUNDARY = b"wvc xet boundary: payloads end here, the index follows.  #0130ba"
assert len(XET_BOUNDARY) == 64
# A pack's index (embedded, or a remote's .idx copy): about 250 bytes an object, so this
# admits ~250k objects, far more than one pack of at most 64 GiB of chunks holds.
MAX_INDEX_BYTES = 64 << 20


@dataclass(frozen=True)
class PackEntry:
    id: str
    offset: int
    length: int
    raw_size: int
    method: int
    base: str | None

    def to_json(self):
        return {
            "id": self.id,
            "offset": self.offset,
            "length": self.length,
            "raw_size": self.raw_size,
            "method": self.method,
            "base": self.base,
        }


def parse_index(data: bytes, where: str, payload_end: int | None = None) -> list[PackEntry]:
    """A pack index (untrusted JSON) -> entries whose every field is checked and bounded:
    ids well formed, sizes within what wvc ever decodes, offsets inside the payload area."""
    if len(data) > MAX_INDEX_BYTES:
        raise CorruptObject(f"{where}: pack index larger than {MAX_INDEX_BYTES} bytes")
    try:
        raw = bounded_json.loads(data, f"{where}: pack index")
        if not isinstance(raw, list):
            raise TypeError("not a list")
        entries = [PackEntry(**e) for e in raw]
    except (ValueError, TypeError, RecursionError) as exc:  # RecursionError: absurdly deep nesting
        why = "JSON nested too deeply" if isinstance(exc, RecursionError) else exc
        raise CorruptObject(f"{where}: bad pack index ({why})") from exc
    for e in entries:
        if not (ids.is_object_id(e.id) and (e.base is None or ids.is_object_id(e.base))
                and all(type(v) is int and v >= 0 for v in (e.offset, e.length, e.raw_size, e.method))
                and e.offset >= len(MAGIC) and e.length <= MAX_PAYLOAD and e.raw_size <= MAX_RAW_CHUNK
                and (payload_end is None or e.offset + e.length <= payload_end)):
            raise CorruptObject(f"{where}: pack index entry out of bounds (object {str(e.id)[:12]})")
    return entries


def pack_filename(name: str) -> str:
    return f"pack-{name}.pack"


class PackWriter:
    """Appends payloads to a temp file; ``finish`` makes it a durable, named pack."""

    def __init__(self, directory: Path):
        self.directory = directory
        fd, self.tmp_path = tempfile.mkstemp(prefix=TEMP_PREFIX, suffix=".pack", dir=directory)
        claim_temp(fd)  # gc leaves it alone while this writer lives
        os.fchmod(fd, file_mode())  # mkstemp's 0600 would keep a shared repository's packs private
        self.fh = EarlyWriteback(os.fdopen(fd, "wb"), PACK_WRITEBACK_BYTES)  # written out as it grows: a short final fsync
        self.hasher = ids.hasher(ids.PACK)
        self.entries: list[PackEntry] = []
        self.written = 0
        try:
            self._write(MAGIC)
        except BaseException:  # nobody holds this writer yet to abort it
            self.abort()
            raise

    def _write(self, data) -> None:
        self.fh.write(data)
        self.hasher.update(data)
        self.written += len(data)

    @property
    def offset(self) -> int:
        return self.written  # (the file's tell() was a system call per object)

    def add(self, object_id: str, payload: bytes, raw_size: int, method: int, base: str | None) -> PackEntry:
        entry = PackEntry(object_id, self.offset, len(payload), raw_size, method, base)
        self._write(payload)
        self.entries.append(entry)
        return entry

    def add_block(self, fd: int, start: int, length: int, entries: list[PackEntry], where: str) -> list[PackEntry]:
        """Append bytes ``[start, start + length)`` of the open pack ``fd`` verbatim, and its
        ``entries`` (all inside that range) at their new offsets: payloads and whatever lies
        between them (a pack's magic and XET_BOUNDARY, which nothing reads)."""
        shift = self.offset - start
        copied = 0
        while copied < length:
            data = read_payload(fd, start + copied, min(8 << 20, length - copied), where)
            self._write(data)
            copied += len(data)
        moved = [PackEntry(e.id, e.offset + shift, e.length, e.raw_size, e.method, e.base) for e in entries]
        self.entries.extend(moved)
        return moved

    def finish(self) -> tuple[str, int] | None:
        """Seal, fsync and rename; returns (pack name, size) or None when empty."""
        if not self.entries:
            self.abort()
            return None
        index = canonical_json([e.to_json() for e in self.entries])
        self._write(XET_BOUNDARY)
        index_offset = self.offset
        self._write(index)
        checksum = self.hasher.digest()
        self.fh.write(_TRAILER.pack(index_offset, len(index), checksum, END))
        self.fh.flush()
        os.fsync(self.fh.fileno())
        size = self.fh.tell()
        self.fh.close()
        name = checksum.hex()
        os.replace(self.tmp_path, self.directory / pack_filename(name))
        fsync_dir(self.directory)
        return name, size

    def abort(self) -> None:
        """Drop the temp file. Closing may fail (a full disk fails the final flush): the
        unlink happens anyway, or a disk that filled up would stay full of our temp pack."""
        try:
            if not self.fh.closed:
                self.fh.close()
        except OSError as exc:
            log.debug("closing the aborted pack %s failed (%s); it is unlinked anyway", self.tmp_path, exc)
        finally:
            try:
                os.unlink(self.tmp_path)
            except FileNotFoundError:
                pass


def pack_checksum(fd: int, size: int) -> str:
    """The checksum a pack of ``size`` bytes open at ``fd`` should carry (its name): the blake3
    (PACK context) of every byte before the trailer, which must say the same."""
    hasher = ids.hasher(ids.PACK)
    end = size - _TRAILER.size
    offset = 0
    while offset < end:
        data = os.pread(fd, min(8 << 20, end - offset), offset)
        if not data:
            break
        hasher.update(data)
        offset += len(data)
    trailer = os.pread(fd, _TRAILER.size, end)
    if offset != end or len(trailer) != _TRAILER.size:
        return ""
    _, _, recorded, magic = _TRAILER.unpack(trailer)
    checksum = hasher.digest()
    return checksum.hex() if magic == END and recorded == checksum else ""


def read_payload(fd: int, offset: int, length: int, where: str) -> bytes:
    """Exactly ``length`` bytes of an open pack at ``offset``, else CorruptObject (a pack cut
    short): the one way a payload is read out of a pack file (PackReader for the store's own
    packs; a fetch's downloaded packs; compaction's)."""
    data = os.pread(fd, length, offset)
    if len(data) != length:
        raise CorruptObject(f"{where} is truncated")
    return data


def copy_payloads(writer: "PackWriter", items, progress=None) -> list[PackEntry]:
    """Append payloads verbatim to ``writer``: ``items`` yields (entry, payload), the entry
    any record with id, raw_size, method and base (a PackEntry, a store row). The one way
    payloads move between packs without being decoded (push, compaction, gc, lazy
    fetches); whoever decodes one later verifies it. ``progress`` is told each payload's size."""
    out = []
    for entry, payload in items:
        out.append(writer.add(entry.id, payload, entry.raw_size, entry.method, entry.base))
        if progress is not None:
            progress.advance(len(payload))
    return out


def marked_payload_end(fd: int, size: int) -> int | None:
    """Where a pack's payloads end if XET_BOUNDARY follows them (the index offset), else None
    (a pack an older wvc wrote). ``size``: the pack's size; the trailer was checked before."""
    index_offset = _TRAILER.unpack(os.pread(fd, _TRAILER.size, size - _TRAILER.size))[0]
    mark = index_offset - len(XET_BOUNDARY)
    return index_offset if mark >= len(MAGIC) and os.pread(fd, len(XET_BOUNDARY), mark) == XET_BOUNDARY else None


def read_pack_index(path: Path, verify: bool = True) -> tuple[str, list[PackEntry]]:
    """Parse a pack's trailer and index (and, with ``verify``, its whole checksum)."""
    size = path.stat().st_size
    if size < len(MAGIC) + _TRAILER.size:
        raise CorruptObject(f"{path.name}: too short to be a pack")
    with open(path, "rb") as fh:
        if fh.read(len(MAGIC)) != MAGIC:
            raise CorruptObject(f"{path.name}: not a wvc pack")
        fh.seek(size - _TRAILER.size)
        index_offset, index_len, checksum, end = _TRAILER.unpack(fh.read(_TRAILER.size))
        if end != END or index_len > MAX_INDEX_BYTES or index_offset + index_len != size - _TRAILER.size:
            raise CorruptObject(f"{path.name}: bad pack trailer")
        if verify:
            fh.seek(0)
            h = ids.hasher(ids.PACK)
            remaining = index_offset + index_len
            while remaining:
                block = fh.read(min(remaining, 1 << 22))
                if not block:
                    raise CorruptObject(f"{path.name}: truncated")
                h.update(block)
                remaining -= len(block)
            if h.digest() != checksum:
                raise CorruptObject(f"{path.name}: checksum mismatch (the pack is damaged)")
        fh.seek(index_offset)
        entries = parse_index(fh.read(index_len), path.name, payload_end=index_offset)
    return checksum.hex(), entries


class PackReader:
    """Reads from pack files: :meth:`read` copies, :meth:`view` maps.

    A decode reads every payload once and keeps none of it, so it takes :meth:`view`: a
    slice of a read-only mapping of the pack, no copy. Packs are mapped in windows of
    ``WINDOW`` bytes that start every ``WINDOW / 2`` (each overlaps the next by half), so a
    payload of up to half a window always lies inside one: the one starting at or before
    it by less than half a window. The ``WINDOWS`` most recently used stay mapped, so a
    process's resident set holds at most that much of its packs however large they are (a
    mapped page counts in the RSS that memory limits and monitors watch; a copy's buffer is
    freed per chunk). A larger payload gets a mapping of its own. A window stays mapped while
    a view into it lives (the slice holds it), so eviction never pulls pages from under a
    decode. Why not pread: its copy into a fresh buffer, then that buffer's page faults,
    were a tenth of a many-tensor checkout's CPU (docs/design.md).

    Packs are immutable, and a pack truncated at rest is caught here (a view beyond its
    end raises CorruptObject, as a short read does); only a pack truncated in place while
    it is mapped would fault the process (SIGBUS), which nothing in wvc does (a pack is
    written once, renamed into place, and deleted whole) -- git maps its packs the same way.
    """

    WINDOW = 8 << 20
    WINDOWS = 4

    def __init__(self, directory: Path):
        self.directory = directory
        self._fds: dict[str, int] = {}
        self._sizes: dict[str, int] = {}
        self._windows: dict[tuple[str, int], memoryview] = {}  # (in use order: oldest first)
        self._lock = threading.Lock()  # decode workers share the descriptors and windows
        # A reader nobody closed (a repository opened for one read, ``wvc.open``'s view) gives
        # its descriptors back when it is collected: raw descriptors have no finalizer of their
        # own, and a process that opened a version a step ran out of them (EMFILE) after ~20k.
        weakref.finalize(self, _close_descriptors, self._fds)

    def read(self, pack: str, offset: int, length: int) -> bytes:
        """The bytes at ``offset``, copied (for callers that keep or re-send them)."""
        with self._lock:  # (the read too: another thread may close the descriptors, and a
            # number closed under a pread can be reused by the next file opened)
            return read_payload(self._fd_locked(pack), offset, length, f"pack {pack[:12]}")

    def view(self, pack: str, offset: int, length: int) -> memoryview:
        """The bytes at ``offset``, a read-only slice of a mapping of the pack (no copy; a
        copy where the pack cannot be mapped)."""
        step = self.WINDOW // 2
        with self._lock:
            fd = self._fd_locked(pack)
            size = self._sizes[pack]
            if offset < 0 or length < 0 or offset + length > size:
                raise CorruptObject(f"pack {pack[:12]} is truncated")
            if length == 0:
                return memoryview(b"")
            k = offset // step
            start = k * step
            try:
                if offset + length > start + self.WINDOW:  # (over half a window: mapped alone, unmapped with its view)
                    start = offset - offset % mmap.ALLOCATIONGRANULARITY
                    return memoryview(self._map(fd, start, offset + length - start))[offset - start:]
                window = self._windows.pop((pack, k), None)
                if window is None:
                    window = memoryview(self._map(fd, start, min(self.WINDOW, size - start)))
                    if len(self._windows) >= self.WINDOWS:
                        del self._windows[next(iter(self._windows))]
                self._windows[(pack, k)] = window
            except (OSError, ValueError):
                window = None  # (a file system that cannot map, address space or map count exhausted,
                # or a pack shorter than when it was opened: the copy says which)
        if window is None:
            return memoryview(self.read(pack, offset, length))
        return window[offset - start : offset - start + length]

    @staticmethod
    def _map(fd: int, offset: int, length: int) -> mmap.mmap:
        return mmap.mmap(fd, length, access=mmap.ACCESS_READ, offset=offset)

    def _fd_locked(self, pack: str) -> int:
        fd = self._fds.get(pack)
        if fd is None:
            if len(self._fds) >= 64:
                self._close_locked()
            try:
                fd = os.open(self.directory / pack_filename(pack), os.O_RDONLY)
            except FileNotFoundError as exc:
                raise PackMissing(f"pack {pack[:12]} is missing") from exc
            self._fds[pack] = fd
            self._sizes[pack] = os.fstat(fd).st_size
        return fd

    def close(self) -> None:
        with self._lock:
            self._close_locked()

    def _close_locked(self) -> None:
        _close_descriptors(self._fds)
        self._sizes.clear()
        self._windows.clear()  # (each unmapped once the last view into it is gone)


def _close_descriptors(fds: dict[str, int]) -> None:
    """Close a reader's pack descriptors (its ``close``, or its finalizer once collected)."""
    for fd in fds.values():
        os.close(fd)
    fds.clear()
