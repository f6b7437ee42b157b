"""The Xet protocol's hashes and binary formats, as the local Hub server checks them.

Written from the Xet protocol specification (huggingface/hub-docs ``docs/xet/``: hashing.md,
xorb.md, shard.md, api.md); the aggregated-hash tree's cut rule is xet-core's
``merklehash/src/aggregated_hashes.rs``. The real ``hf_xet`` client is the test of it: what
it uploads must parse and verify here unchanged. Everything parsed is untrusted: sizes are
bounded and every offset is checked before use.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import blake3

DATA_KEY = bytes([102, 151, 245, 119, 91, 149, 80, 222, 49, 53, 203, 172, 165, 151, 24, 28, 157, 228, 33, 16,
                  155, 235, 43, 88, 180, 208, 176, 75, 147, 173, 242, 41])
INTERNAL_NODE_KEY = bytes([1, 126, 197, 199, 165, 71, 41, 150, 253, 148, 102, 102, 180, 138, 2, 230, 93, 221, 83,
                           111, 55, 199, 109, 210, 248, 99, 82, 230, 74, 83, 113, 63])
VERIFICATION_KEY = bytes([127, 24, 87, 214, 206, 86, 237, 102, 18, 127, 249, 19, 231, 165, 195, 243, 164, 205, 38,
                          213, 181, 219, 73, 230, 65, 36, 152, 127, 40, 251, 148, 195])
MEAN_BRANCHING = 4
MAX_XORB_BYTES = 64 << 20  # the CAS refuses bigger serialized xorbs (xorb.md)
MAX_CHUNK_BYTES = 128 << 10
MAX_SHARD_BYTES = 64 << 20
BOOKEND = b"\xff" * 32
# the shard header's magic (shard.md names it, xet-core's MDB_SHARD_HEADER_TAG holds it)
SHARD_TAG = b"HFRepoMetaData\x00UigEj{\x81W\x83\xa5\xbd\xd9\\\xcd\xd1J\xa9"
SHARD_HEADER_VERSION = 2
FILE_FLAG_VERIFICATION = 1 << 31
FILE_FLAG_METADATA_EXT = 1 << 30
ZERO = bytes(32)


class XetFormatError(ValueError):
    """A xorb, shard or hash that does not follow the protocol (answered 400)."""


# -- hashes ------------------------------------------------------------------------------------
def hash_hex(h: bytes) -> str:
    """The protocol's string form: each 8-byte word as a little-endian u64, in hex (api.md)."""
    return "".join(f"{int.from_bytes(h[i:i + 8], 'little'):016x}" for i in range(0, 32, 8))


def hex_hash(s: str) -> bytes:
    if len(s) != 64 or any(c not in "0123456789abcdef" for c in s):
        raise XetFormatError(f"not a Xet hash: {s[:80]!r}")
    return b"".join(int(s[i:i + 16], 16).to_bytes(8, "little") for i in range(0, 64, 16))


def chunk_hash(data: bytes) -> bytes:
    return blake3.blake3(data, key=DATA_KEY).digest()


def _cut(nodes: list[tuple[bytes, int]], start: int) -> int:
    """Where the tree node starting at ``start`` ends: after a child whose hash is 0 mod 4
    (from the third child on), at most 2 * 4 + 1 children."""
    n = len(nodes) - start
    if n <= 2:
        return len(nodes)
    end = min(2 * MEAN_BRANCHING + 1, n)
    for i in range(2, end):
        if int.from_bytes(nodes[start + i][0][24:32], "little") % MEAN_BRANCHING == 0:
            return start + i + 1
    return start + end


def _node(children: list[tuple[bytes, int]]) -> tuple[bytes, int]:
    text = "".join(f"{hash_hex(h)} : {size}\n" for h, size in children)
    return blake3.blake3(text.encode(), key=INTERNAL_NODE_KEY).digest(), sum(s for _, s in children)


def merkle_root(chunks: list[tuple[bytes, int]]) -> bytes:
    """The aggregated hash of (chunk hash, size) pairs: a xorb's hash."""
    if not chunks:
        return ZERO
    level = list(chunks)
    while len(level) > 1:
        out, i = [], 0
        while i < len(level):
            j = _cut(level, i)
            out.append(_node(level[i:j]))
            i = j
        level = out
    return level[0][0]


def file_hash(chunks: list[tuple[bytes, int]]) -> bytes:
    if not chunks:
        return ZERO
    return blake3.blake3(merkle_root(chunks), key=ZERO).digest()


def verification_hash(hashes: list[bytes]) -> bytes:
    return blake3.blake3(b"".join(hashes), key=VERIFICATION_KEY).digest()


# -- xorbs -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Chunk:
    start: int  # byte offset of its header in the xorb
    end: int  # one past its compressed data
    hash: bytes
    size: int  # uncompressed


def decompress(scheme: int, data: bytes, size: int) -> bytes:
    try:
        import lz4.block
        import lz4.frame
    except ImportError as exc:  # a setup problem of the server, not bad input
        raise RuntimeError("the local Hub server needs the lz4 package to read Xet chunks: "
                           "pip install 'wvc[hub]'") from exc

    if scheme == 0:
        out = data
    elif scheme in (1, 2):
        try:
            if data[:4] == b"\x04\x22\x4d\x18":  # an LZ4 frame (xet-core writes frames)
                out = lz4.frame.decompress(data)
            else:
                out = lz4.block.decompress(data, uncompressed_size=size)
        except RuntimeError as exc:
            raise XetFormatError(f"a chunk does not decompress ({exc})") from exc
        if scheme == 2:  # byte grouping: four groups, the first len % 4 of them one byte longer
            n, groups, at = len(out), [], 0
            for g in range(4):
                length = n // 4 + (1 if g < n % 4 else 0)
                groups.append(out[at:at + length])
                at += length
            regrouped = bytearray(n)
            for g in range(4):
                regrouped[g::4] = groups[g]
            out = bytes(regrouped)
    else:
        raise XetFormatError(f"unknown chunk compression scheme {scheme}")
    if len(out) != size:
        raise XetFormatError(f"a chunk decompressed to {len(out)} bytes, its header says {size}")
    return out


def read_chunks(data: bytes, first_index: int = 0, count: int | None = None):
    """(index, uncompressed bytes) for the chunks serialized back to back in ``data``."""
    at, index = 0, first_index
    while at < len(data) and (count is None or index - first_index < count):
        if len(data) - at < 8:
            raise XetFormatError("a chunk header is cut off")
        version, csize, scheme, usize = data[at], int.from_bytes(data[at + 1:at + 4], "little"), data[at + 4], \
            int.from_bytes(data[at + 5:at + 8], "little")
        if version != 0 or usize > MAX_CHUNK_BYTES or at + 8 + csize > len(data):
            raise XetFormatError(f"chunk {index}: a bad header (version {version}, {csize} -> {usize} bytes)")
        yield index, decompress(scheme, data[at + 8:at + 8 + csize], usize)
        at += 8 + csize
        index += 1


def _chunk_end(body: bytes) -> int:
    """Where a xorb's chunk sequence ends: the whole body when it holds chunks only (as
    hf_xet uploads them), else where its footer (XorbObjectInfo, then that footer's length as
    the final u32) begins."""
    at = 0
    while at + 8 <= len(body) and body[at] == 0:
        at += 8 + int.from_bytes(body[at + 1:at + 4], "little")
    if at == len(body):
        return at
    if len(body) < 36:
        raise XetFormatError("a xorb that is neither chunks only nor chunks and a footer")
    info_length = int.from_bytes(body[-4:], "little")
    end = len(body) - 4 - info_length
    if info_length < 32 or end < 0:
        raise XetFormatError("a xorb whose footer length is out of bounds")
    return end


def parse_xorb(body: bytes) -> list[Chunk]:
    """The chunks of a serialized xorb, each hashed (a footer's chunk count must agree)."""
    if len(body) > MAX_XORB_BYTES:
        raise XetFormatError(f"a xorb of {len(body)} bytes is over the 64 MiB limit")
    end = _chunk_end(body)
    chunks, at = [], 0
    for _, raw in read_chunks(body[:end]):
        csize = int.from_bytes(body[at + 1:at + 4], "little")
        chunks.append(Chunk(at, at + 8 + csize, chunk_hash(raw), len(raw)))
        at += 8 + csize
    declared = int.from_bytes(body[-32:-28], "little") if end < len(body) else len(chunks)
    if at != end or len(chunks) != declared or not chunks:
        raise XetFormatError(f"a xorb's chunks ({len(chunks)}, ending at byte {at}) disagree with its footer "
                             f"({declared}, ending at {end})")
    return chunks


def serialize_xorb(chunks: list[bytes]) -> bytes:
    """Uncompressed chunks as a xorb (tests build their own with this; hf_xet builds real ones)."""
    body = bytearray()
    hashes = []
    for data in chunks:
        body += bytes([0]) + len(data).to_bytes(3, "little") + bytes([0]) + len(data).to_bytes(3, "little") + data
        hashes.append((chunk_hash(data), len(data)))
    # a footer with the fixed tail the spec describes; its other sections are not read here
    info = b"XETBLOB\x00" + merkle_root(hashes) + struct.pack("<III", len(chunks), 0, 0) + bytes(16)
    return bytes(body) + info + struct.pack("<I", len(info))


# -- shards ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Term:
    xorb: bytes
    unpacked: int
    start: int
    end: int  # exclusive
    verification: bytes | None


@dataclass(frozen=True)
class FileInfo:
    hash: bytes
    terms: tuple[Term, ...]
    sha256: bytes | None  # as stored: hex_hash() of the sha256's hex


@dataclass(frozen=True)
class XorbInfo:
    hash: bytes
    chunks: tuple[tuple[bytes, int, int], ...]  # (chunk hash, byte start, unpacked size)
    unpacked: int
    serialized: int


def parse_shard(body: bytes) -> tuple[list[FileInfo], list[XorbInfo]]:
    """The file infos and xorb infos of a shard as uploaded (no footer)."""
    if len(body) > MAX_SHARD_BYTES:
        raise XetFormatError("a shard over the size limit")
    if len(body) < 48:
        raise XetFormatError("a shard shorter than its header")
    if body[:32] != SHARD_TAG:
        raise XetFormatError("not a shard (its header tag is wrong)")
    version, footer_size = struct.unpack_from("<QQ", body, 32)
    if version != SHARD_HEADER_VERSION:
        raise XetFormatError(f"shard header version {version}, not {SHARD_HEADER_VERSION}")
    if footer_size > len(body) - 48:
        raise XetFormatError("a shard whose footer size is out of bounds")
    limit = len(body) - footer_size
    at = 48

    def entry() -> bytes:
        nonlocal at
        if at + 48 > limit:
            raise XetFormatError("a shard cut off before its bookend")
        at += 48
        return body[at - 48:at]

    files = []
    while True:
        head = entry()
        if head[:32] == BOOKEND:
            break
        flags, n = struct.unpack_from("<II", head, 32)
        if n == 0 or n > limit // 48:
            raise XetFormatError(f"a file info with {n} terms")
        raw_terms = [entry() for _ in range(n)]
        checks = [entry()[:32] for _ in range(n)] if flags & FILE_FLAG_VERIFICATION else [None] * n
        sha256 = entry()[:32] if flags & FILE_FLAG_METADATA_EXT else None
        terms = []
        for raw, check in zip(raw_terms, checks):
            _, unpacked, start, end = struct.unpack_from("<IIII", raw, 32)
            if end <= start:
                raise XetFormatError(f"a term with an empty chunk range [{start}, {end})")
            terms.append(Term(raw[:32], unpacked, start, end, check))
        files.append(FileInfo(head[:32], tuple(terms), sha256))
    xorbs = []
    while True:
        head = entry()
        if head[:32] == BOOKEND:
            break
        _, n, unpacked, serialized = struct.unpack_from("<IIII", head, 32)
        if n > limit // 48:
            raise XetFormatError(f"a xorb info with {n} chunks")
        chunks = []
        for _ in range(n):
            raw = entry()
            start, size = struct.unpack_from("<II", raw, 32)
            chunks.append((raw[:32], start, size))
        xorbs.append(XorbInfo(head[:32], tuple(chunks), unpacked, serialized))
    if files and len({f.terms[0].verification is None for f in files}) > 1:
        raise XetFormatError("verification entries on some files of a shard and not on others")
    return files, xorbs


def serialize_shard(files: list[FileInfo]) -> bytes:
    """A shard of file infos only, with verification and sha256 entries (tests send their own)."""
    out = bytearray(SHARD_TAG + struct.pack("<QQ", SHARD_HEADER_VERSION, 0))
    for f in files:
        flags = FILE_FLAG_VERIFICATION | (FILE_FLAG_METADATA_EXT if f.sha256 else 0)
        out += f.hash + struct.pack("<II", flags, len(f.terms)) + bytes(8)
        for t in f.terms:
            out += t.xorb + struct.pack("<IIII", 0, t.unpacked, t.start, t.end)
        for t in f.terms:
            out += (t.verification or ZERO) + bytes(16)
        if f.sha256:
            out += f.sha256 + bytes(16)
    out += BOOKEND + bytes(16) + BOOKEND + bytes(16)
    return bytes(out)
