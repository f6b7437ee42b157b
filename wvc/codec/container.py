"""The payload container (no torch): header, plane table, bounded zstd.

Layout of a payload (all integers little-endian)::

    u8  codec version (1)
    u8  method (Method)
    u8  element width in bytes (the plane count)
    u8  reserved (0)
    u64 raw size
    per plane: u8 coder (0 stored, 1 zstd), u64 stored length
    plane bytes, in order

Each plane holds byte *k* of every element (of the value, or of its delta against the
base chunk). Splitting bytes by significance puts the low-entropy bytes (sign/exponent, or
the mostly-zero high bytes of a small delta) together, where zstd finds them.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

import zstandard

from ..errors import CorruptObject

CODEC_VERSION = 1
_HEAD = struct.Struct("<BBBBQ")
_PLANE = struct.Struct("<BQ")
CODER_STORED = 0
CODER_ZSTD = 1


class Method(enum.IntEnum):
    RAW = 0  # no transform, width 1
    PLANES = 1  # byte planes of the value
    XOR = 2  # byte planes of value XOR base
    ULP = 3  # byte planes of zigzag(ordered(value) - ordered(base)), floats
    SUB = 4  # byte planes of zigzag(value - base), integers

    @property
    def uses_base(self) -> bool:
        return self in (Method.XOR, Method.ULP, Method.SUB)


@dataclass(frozen=True)
class PayloadInfo:
    method: Method
    width: int
    raw_size: int
    planes: tuple[tuple[int, int, int], ...]  # (coder, offset, length) per plane


def pack(method: Method, width: int, raw_size: int, planes: list[tuple[int, bytes]]) -> bytes:
    parts = [_HEAD.pack(CODEC_VERSION, int(method), width, 0, raw_size)]
    parts += [_PLANE.pack(coder, len(data)) for coder, data in planes]
    parts += [data for _, data in planes]
    return b"".join(parts)


def peek(payload) -> PayloadInfo:
    """Parse and bound-check a payload's header without decoding it."""
    payload = memoryview(payload)
    if len(payload) < _HEAD.size:
        raise CorruptObject("payload shorter than its header")
    version, method, width, _, raw_size = _HEAD.unpack_from(payload)
    if version != CODEC_VERSION:
        raise CorruptObject(f"unknown codec version {version}")
    try:
        method = Method(method)
    except ValueError:
        raise CorruptObject(f"unknown codec method {method}") from None
    if width not in (1, 2, 4, 8) or raw_size % width:
        raise CorruptObject(f"bad element width {width} for {raw_size} bytes")
    offset = _HEAD.size + width * _PLANE.size
    if len(payload) < offset:
        raise CorruptObject("payload plane table truncated")
    planes = []
    for k in range(width):
        coder, length = _PLANE.unpack_from(payload, _HEAD.size + k * _PLANE.size)
        if coder not in (CODER_STORED, CODER_ZSTD):
            raise CorruptObject(f"unknown plane coder {coder}")
        planes.append((coder, offset, length))
        offset += length
    if offset != len(payload):
        raise CorruptObject("payload length does not match its plane table")
    return PayloadInfo(method, width, raw_size, tuple(planes))


def compress_plane(data, level: int) -> tuple[int, bytes]:
    """zstd the plane unless that does not pay; incompressible planes are stored as is."""
    if len(data) < 64:
        return CODER_STORED, bytes(data)
    compressed = zstandard.ZstdCompressor(level=level).compress(data)
    if len(compressed) >= len(data) - len(data) // 64:
        return CODER_STORED, bytes(data)
    return CODER_ZSTD, compressed


def plane_bytes(payload, info: PayloadInfo, k: int) -> bytes:
    """Plane ``k`` decompressed to exactly ``raw_size / width`` bytes, or CorruptObject."""
    coder, offset, length = info.planes[k]
    expected = info.raw_size // info.width
    data = memoryview(payload)[offset : offset + length]
    if coder == CODER_STORED:
        if length != expected:
            raise CorruptObject("stored plane has the wrong length")
        return data
    declared = zstandard.frame_content_size(data) if length >= 4 else -2
    if declared not in (expected, -1):  # -1: size not in the frame header
        raise CorruptObject("zstd frame declares the wrong size")
    try:
        # Reading at most expected+1 bytes bounds memory whatever the frame claims.
        out = zstandard.ZstdDecompressor().stream_reader(bytes(data)).read(expected + 1)
    except zstandard.ZstdError as exc:
        raise CorruptObject(f"zstd: {exc}") from None
    if len(out) != expected:
        raise CorruptObject("zstd plane decoded to the wrong length")
    return out
