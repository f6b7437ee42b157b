"""The payload container (no torch): header, stream table, bounded zstd.

Layout of a payload (all integers little-endian)::

    u8  codec version (1)
    u8  method (Method)
    u8  element width in bytes
    u8  parameter (ULP_EXP: the exponent field's bit shift; else 0)
    u64 raw size
    u32 stream count
    per stream: u8 coder (0 stored, 1 zstd), u64 raw length, u64 stored length
    stream bytes, in order

A stream is one byte plane (byte *k* of every element, of the value or of its delta), or
for grouped methods one plane of one group. Splitting bytes by significance puts the
low-entropy bytes (sign/exponent, or the mostly-zero high bytes of a small delta)
together, where zstd finds them. Raw lengths are in the table so that a payload can be
bounds-checked before anything is decompressed: they must add up to the raw size.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

import zstandard

from ..errors import CorruptObject

CODEC_VERSION = 1
_HEAD = struct.Struct("<BBBBQI")
_STREAM = struct.Struct("<BQQ")
CODER_STORED = 0
CODER_ZSTD = 1
MAX_STREAMS = 1 << 16


class Method(enum.IntEnum):
    RAW = 0  # no transform, width 1
    PLANES = 1  # byte planes of the value
    XOR = 2  # byte planes of value XOR base
    ULP = 3  # byte planes of zigzag(ordered(value) - ordered(base)), floats
    SUB = 4  # byte planes of zigzag(value - base), integers
    ULP_EXP = 5  # ULP deltas grouped by the base value's exponent, planes per group

    @property
    def uses_base(self) -> bool:
        return self in (Method.XOR, Method.ULP, Method.SUB, Method.ULP_EXP)


@dataclass(frozen=True)
class PayloadInfo:
    method: Method
    width: int
    param: int
    raw_size: int
    streams: tuple[tuple[int, int, int, int], ...]  # (coder, raw length, offset, stored length)


def pack(method: Method, width: int, param: int, raw_size: int, streams: list[tuple[int, int, bytes]]) -> bytes:
    """``streams``: (coder, raw length, stored bytes) in decoding order."""
    parts = [_HEAD.pack(CODEC_VERSION, int(method), width, param, raw_size, len(streams))]
    parts += [_STREAM.pack(coder, raw_len, len(data)) for coder, raw_len, data in streams]
    parts += [data for _, _, data in streams]
    return b"".join(parts)


def peek(payload) -> PayloadInfo:
    """Parse and bound-check a payload's header without decoding it."""
    payload = memoryview(payload)
    if len(payload) < _HEAD.size:
        raise CorruptObject("payload shorter than its header")
    version, method, width, param, raw_size, count = _HEAD.unpack_from(payload)
    if version != CODEC_VERSION:
        raise CorruptObject(f"unknown codec version {version}")
    try:
        method = Method(method)
    except ValueError:
        raise CorruptObject(f"unknown codec method {method}") from None
    if width not in (1, 2, 4, 8) or raw_size % width:
        raise CorruptObject(f"bad element width {width} for {raw_size} bytes")
    if param >= width * 8 - 1 or (param and method != Method.ULP_EXP):
        raise CorruptObject(f"bad codec parameter {param}")
    if count > MAX_STREAMS:
        raise CorruptObject("too many streams")
    offset = _HEAD.size + count * _STREAM.size
    if len(payload) < offset:
        raise CorruptObject("payload stream table truncated")
    streams, total = [], 0
    for k in range(count):
        coder, raw_len, length = _STREAM.unpack_from(payload, _HEAD.size + k * _STREAM.size)
        if coder not in (CODER_STORED, CODER_ZSTD):
            raise CorruptObject(f"unknown stream coder {coder}")
        if coder == CODER_STORED and raw_len != length:
            raise CorruptObject("stored stream has the wrong length")
        streams.append((coder, raw_len, offset, length))
        offset += length
        total += raw_len
    if offset != len(payload):
        raise CorruptObject("payload length does not match its stream table")
    if total != raw_size:
        raise CorruptObject("stream lengths do not add up to the raw size")
    return PayloadInfo(method, width, param, raw_size, tuple(streams))


def compress_stream(data, level: int) -> tuple[int, int, bytes]:
    """zstd the stream unless that does not pay; incompressible streams are stored as is."""
    n = len(data)
    if n < 64:
        return CODER_STORED, n, bytes(data)
    compressed = zstandard.ZstdCompressor(level=level).compress(data)
    if len(compressed) >= n - n // 64:
        return CODER_STORED, n, bytes(data)
    return CODER_ZSTD, n, compressed


def stream_bytes(payload, info: PayloadInfo, k: int):
    """Stream ``k`` decompressed to exactly its recorded raw length, or CorruptObject."""
    coder, expected, offset, length = info.streams[k]
    data = memoryview(payload)[offset : offset + length]
    if coder == CODER_STORED:
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
        raise CorruptObject("zstd stream decoded to the wrong length")
    return out
