"""The payload container (no torch): header, stream table, bounded zstd.

Layout of a payload (all integers little-endian)::

    u8  codec version (1)
    u8  method (Method)
    u8  element width in bytes
    u8  parameter (ULP_EXP and the step coders: the exponent field's bit shift; SPARSE: the inner
        method; PLANES: 1 when each element was rotated left by one bit first; else 0)
    u64 raw size
    u32 stream count
    per stream: u8 coder, u64 raw length, u64 stored length
        coders: 0 stored; 1 zstd; 2, 3, 4: bytes < 2, 4, 16 packed 8, 4, 2 to a byte, then zstd
    stream bytes, in order

The step coders' header (ULP_STEP, STEP_BLOCKS, STEP_RUNS) is shorter (their payloads are tens
of bytes for a small tensor's step, where twelve bytes were a tenth of a step): u8 version,
method, width, parameter, then the raw size as an unsigned LEB128 varint (at most 10 bytes, the shortest
form), then the range-coded bits (codec/step_coder.py); no stream table.

A stream is one byte plane (byte *k* of every element, of the value or of its delta), or
for grouped methods one plane of one group. Splitting bytes by significance puts the
low-entropy bytes (sign/exponent, or the mostly-zero high bytes of a small delta)
together, where zstd finds them. Raw lengths are in the table so that a payload can be
bounds-checked before anything is decompressed: they must add up to the raw size.
"""

from __future__ import annotations

import enum
import struct
import threading
from dataclasses import dataclass

import zstandard

from ..errors import CorruptObject
from . import native

CODEC_VERSION = 1
_HEAD = struct.Struct("<BBBBQI")
_STREAM = struct.Struct("<BQQ")
CODER_STORED = 0
CODER_ZSTD = 1
CODER_PACKED = {2: 1, 3: 2, 4: 4}  # coder -> bits per value
MAX_STREAMS = 1 << 16
MAX_EXPONENT_BITS = 12  # the widest exponent field a coder keys on (F64's is 11): ULP_EXP's and ULP_STEP's bound
STEP_WIDTHS = (1, 2, 4)  # the element widths a ULP_STEP payload may have


def step_supports(width: int, shift: int) -> bool:
    """Whether a ULP_STEP payload may have elements of ``width`` bytes with an exponent field
    at ``shift`` (codec/step_coder.py codes exactly these)."""
    return width in STEP_WIDTHS and 1 <= shift < 8 * width - 1 and 8 * width - 1 - shift <= MAX_EXPONENT_BITS


ROTATED = 1  # PLANES parameter: elements rotated left one bit (the sign to bit 0) before the split


class Method(enum.IntEnum):
    RAW = 0  # no transform, width 1
    PLANES = 1  # byte planes of the value
    XOR = 2  # byte planes of value XOR base
    ULP = 3  # byte planes of zigzag(ordered(value) - ordered(base)), floats
    SUB = 4  # byte planes of zigzag(value - base), integers
    ULP_EXP = 5  # ULP deltas grouped by the base value's exponent, planes per group
    SPARSE = 6  # positions (gap-coded) and values of the nonzero deltas of an inner method
    ULP_STEP = 7  # ULP deltas range-coded in the context of the base's own step (codec/step_coder.py)
    STEP_BLOCKS = 8  # the same, coded in element order by blocks of 64: decodes in one pass (codec/step_coder.py)
    STEP_RUNS = 9  # STEP_BLOCKS with runs of unchanged blocks for its block flags: a lighter pass (codec/step_coder.py)

    @property
    def uses_base(self) -> bool:
        return self.uses_context or self in (Method.XOR, Method.ULP, Method.SUB, Method.ULP_EXP, Method.SPARSE)

    @property
    def uses_context(self) -> bool:
        """Decoding also needs the base's own base (the version before the base): the step coders."""
        return self in STEP_METHODS


STEP_METHODS = (Method.ULP_STEP, Method.STEP_BLOCKS, Method.STEP_RUNS)


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


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _step_head(payload) -> tuple[int, int, int, int]:
    """(width, param, raw size, header length) of a step coder's payload, bounded."""
    if len(payload) < 5:
        raise CorruptObject("payload shorter than its header")
    width, param = payload[2], payload[3]
    raw_size, shift, at = 0, 0, 4
    while True:
        if at >= len(payload) or at >= 14:
            raise CorruptObject("step payload size is truncated or too long")
        byte = payload[at]
        raw_size |= (byte & 0x7F) << shift
        at += 1
        if not byte & 0x80:
            break
        shift += 7
    if at > 5 and payload[at - 1] == 0 or raw_size >= 1 << 64:
        raise CorruptObject("step payload size is not in its shortest form")
    return width, param, raw_size, at


def peek(payload, table: bool = True) -> PayloadInfo:
    """Parse and bound-check a payload's header without decoding it.

    ``table=False``: the fixed header only (method, width, parameter, raw size), with no
    streams listed, for the C kernels' whole-payload decoders, which check the stream
    table again themselves: parsing it here too cost ~25 us a chunk, 3% of a checkout."""
    payload = memoryview(payload)
    if len(payload) >= 2 and payload[0] == CODEC_VERSION and payload[1] in STEP_METHODS:
        width, param, raw_size, _ = _step_head(payload)
        if not step_supports(width, param) or raw_size % width:
            raise CorruptObject(f"bad codec parameter {param} for width {width}")
        return PayloadInfo(Method(payload[1]), width, param, raw_size, ())
    if len(payload) < _HEAD.size:
        raise CorruptObject("payload shorter than its header")
    version, method, width, param, raw_size, count = _HEAD.unpack_from(payload)
    if version != CODEC_VERSION:
        raise CorruptObject(f"unknown codec version {version}")
    try:
        method = Method(method)
    except ValueError as exc:
        raise CorruptObject(f"unknown codec method {method}") from exc
    if width not in (1, 2, 4, 8) or raw_size % width:
        raise CorruptObject(f"bad element width {width} for {raw_size} bytes")
    if method is Method.SPARSE:
        if param not in (Method.XOR, Method.ULP, Method.SUB):
            raise CorruptObject(f"bad inner method {param} for a sparse payload")
    elif method is Method.PLANES:
        if param not in (0, ROTATED) or (param and width == 1):
            raise CorruptObject(f"bad codec parameter {param}")
    elif param >= width * 8 - 1 or (param and method != Method.ULP_EXP):
        raise CorruptObject(f"bad codec parameter {param}")
    elif method is Method.ULP_EXP:
        # ULP_EXP groups by the exponent field above bit ``param``: a field wider than any
        # float's (F64's is 11 bits) would size the group table by 2**(bits - 1 - param)
        # (F32 with 0: 2**31 counters)
        if not 1 <= param or width * 8 - 1 - param > MAX_EXPONENT_BITS:
            raise CorruptObject(f"bad codec parameter {param} for width {width}")
    if count > MAX_STREAMS:
        raise CorruptObject("too many streams")
    if not table:
        return PayloadInfo(method, width, param, raw_size, ())
    offset = _HEAD.size + count * _STREAM.size
    if len(payload) < offset:
        raise CorruptObject("payload stream table truncated")
    streams, total = [], 0
    for k in range(count):
        coder, raw_len, length = _STREAM.unpack_from(payload, _HEAD.size + k * _STREAM.size)
        if coder not in (CODER_STORED, CODER_ZSTD, *CODER_PACKED):
            raise CorruptObject(f"unknown stream coder {coder}")
        if coder == CODER_STORED and raw_len != length:
            raise CorruptObject("stored stream has the wrong length")
        streams.append((coder, raw_len, offset, length))
        offset += length
        total += raw_len
    if offset != len(payload):
        raise CorruptObject("payload length does not match its stream table")
    if total != raw_size and method is not Method.SPARSE:
        raise CorruptObject("stream lengths do not add up to the raw size")
    if method is Method.SPARSE and total > raw_size // width * (1 + 4 + width):
        raise CorruptObject("sparse streams larger than every element changed would need")
    return PayloadInfo(method, width, param, raw_size, tuple(streams))


# Order-0 entropy above which a plane is stored without trying zstd. zstd keeps a stream
# only when it saves 1/64 (1.6%); on such planes Huffman can save at most 1.5% and LZ
# matches are as good as absent (measured: stored anyway in every benchmark case).
INCOMPRESSIBLE_BITS = 7.88


_COMPRESSORS = threading.local()


def _compressor(level: int) -> zstandard.ZstdCompressor:
    """zstd at ``level`` with long minimum matches and a tiny match table, one per thread.

    Planes of weights and deltas are mostly entropy, not repetition: short matches found by
    a big hash table cost time and break up the Huffman-coded literals. Measured on the
    benchmark's chunks: min_match 7 and hash_log 6 are both faster and smaller than plain
    level 1 (bf16 fine-tune 5.77x -> 5.90x, first commit 1.457x -> 1.491x, 10-25% faster).
    Frames stay standard zstd.
    """
    cache = _COMPRESSORS.__dict__
    if level not in cache:
        cache[level] = zstandard.ZstdCompressor(compression_params=_parameters(level))
    return cache[level]


def _parameters(level: int) -> zstandard.ZstdCompressionParameters:
    return zstandard.ZstdCompressionParameters.from_level(level, min_match=7, hash_log=6)


# zstd.h's ZSTD_c_* number of each ZstdCompressionParameters attribute, in the order
# python-zstandard sets them on its context (backend_cffi._make_cctx_params)
_ZSTD_PARAMETER_IDS = (
    ("format", 10), ("compression_level", 100), ("window_log", 101), ("hash_log", 102), ("chain_log", 103),
    ("search_log", 104), ("min_match", 105), ("target_length", 106), ("strategy", 107),
    ("write_content_size", 200), ("write_checksum", 201), ("write_dict_id", 202), ("threads", 400),
    ("job_size", 401), ("overlap_log", 402), ("force_max_window", 1000), ("enable_ldm", 160),
    ("ldm_hash_log", 161), ("ldm_min_match", 162), ("ldm_bucket_size_log", 163), ("ldm_hash_rate_log", 164),
)
_PARAMETER_PAIRS: dict[int, bytes] = {}


def zstd_parameters(level: int) -> bytes:
    """The (ZSTD_c_* id, value) pairs, native int32s, that give the C kernels' zstd context
    the parameters of :func:`_compressor`'s, for ``encode_payload``."""
    if level not in _PARAMETER_PAIRS:
        params = _parameters(level)
        pairs = [v for name, pid in _ZSTD_PARAMETER_IDS for v in (pid, int(getattr(params, name)))]
        _PARAMETER_PAIRS[level] = struct.pack(f"={len(pairs)}i", *pairs)
    return _PARAMETER_PAIRS[level]


ENTROPY_SAMPLE_STRIDE = 16  # the noise test looks at every 16th byte of a large plane


def _entropy_bits(arr) -> float:
    """Bits per byte of the order-0 model of ``arr``, estimated on a fixed stride sample
    (a full histogram cost ~15% of an encode); deterministic, so every path decides alike."""
    import numpy as np

    sample = arr[::ENTROPY_SAMPLE_STRIDE] if len(arr) >= 64 * ENTROPY_SAMPLE_STRIDE else arr
    counts = np.bincount(sample, minlength=256)
    p = counts[counts > 0] / len(sample)
    return float(-(p * np.log2(p)).sum())


PACKED_BELOW = 16  # a stream whose bytes are all below this is bit-packed (at most 4 bits each)


def _stream_stats(view) -> tuple[int, float | None]:
    """(largest byte, estimated bits per byte, or None for a stream to bit-pack) of a stream;
    the C kernel needs no numpy."""
    if (kernels := native.kernels) is not None:
        return kernels.stream_stats(view, ENTROPY_SAMPLE_STRIDE, PACKED_BELOW)
    import numpy as np

    arr = np.frombuffer(view, dtype=np.uint8)
    top = int(arr.max())
    return top, (_entropy_bits(arr) if top >= PACKED_BELOW else None)


def _pack_bits(data, bits: int):
    if (kernels := native.kernels) is not None:
        return kernels.pack_bits(data, bits)
    import numpy as np

    return _pack_bits_numpy(np.frombuffer(data, dtype=np.uint8), bits)


def _unpack_bits(packed, bits: int, n: int):
    if (kernels := native.kernels) is not None:
        try:
            return kernels.unpack_bits(packed, bits, n)
        except ValueError as exc:
            raise CorruptObject("bit-packed stream is too short") from exc
    import numpy as np

    return _unpack_bits_numpy(np.frombuffer(packed, dtype=np.uint8), bits, n)


def _pack_bits_numpy(arr, bits: int):
    import numpy as np

    per = 8 // bits
    padded = np.zeros(-(-len(arr) // per) * per, dtype=np.uint8)
    padded[: len(arr)] = arr
    lanes = padded.reshape(-1, per)
    out = np.zeros(len(lanes), dtype=np.uint8)
    for k in range(per):
        out |= lanes[:, k] << (k * bits)
    return out


def _unpack_bits_numpy(packed, bits: int, n: int):
    import numpy as np

    per = 8 // bits
    mask = (1 << bits) - 1
    lanes = np.stack([(packed >> (k * bits)) & mask for k in range(per)], axis=1)
    return lanes.reshape(-1)[:n]


def compress_stream(data, level: int) -> tuple[int, int, bytes]:
    """The smallest of: stored, zstd, and (for small alphabets) bit-packed then zstd.

    zstd's literal coder (Huffman) spends at least one bit per byte, far above the entropy
    of a plane whose bytes are nearly all 0 or 1; packing several such values into a byte
    lets Huffman code them jointly. ``data``: any contiguous bytes-like (a memoryview of
    planes, a numpy or torch plane).
    """
    view = memoryview(data).cast("B")
    n = len(view)
    if n < 64:
        return CODER_STORED, n, bytes(view)
    zstd = _compressor(level)
    top, entropy = _stream_stats(view)  # top is exact: packing needs every value below 2**bits
    if top < PACKED_BELOW:
        # Bit-packed is the smaller one in 395 of 418 such planes of the benchmark's
        # fine-tunes, and 0.05% larger overall when not: not worth a second zstd call.
        bits = 1 if top < 2 else 2 if top < 4 else 4
        return {v: k for k, v in CODER_PACKED.items()}[bits], n, zstd.compress(_pack_bits(view, bits))
    if entropy > INCOMPRESSIBLE_BITS:
        return CODER_STORED, n, bytes(view)  # noise (low mantissa bytes): zstd would store it anyway
    compressed = zstd.compress(view)
    if len(compressed) < n - n // 64:
        return CODER_ZSTD, n, compressed
    return CODER_STORED, n, bytes(view)


def step_bits(payload) -> memoryview:
    """A step payload's coded bits (after the header; peek has checked it is one)."""
    return memoryview(payload)[_step_head(memoryview(payload))[3]:]


def pack_step(width: int, param: int, raw_size: int, bits: bytes, method: Method = Method.ULP_STEP) -> bytes:
    return bytes((CODEC_VERSION, int(method), width, param)) + _varint(raw_size) + bits


def stream_bytes(payload, info: PayloadInfo, k: int):
    """Stream ``k`` decompressed to exactly its recorded raw length, or CorruptObject."""
    coder, expected, offset, length = info.streams[k]
    data = memoryview(payload)[offset : offset + length]
    if coder == CODER_STORED:
        return data
    bits = CODER_PACKED.get(coder)
    inner = expected if bits is None else -(-expected * bits // 8)
    out = _bounded_zstd(data, inner)
    if bits is not None:
        return _unpack_bits(out, bits, expected)
    return out


def _bounded_zstd(data, expected: int) -> bytes:
    try:
        declared = zstandard.frame_content_size(data) if len(data) >= 4 else -2
    except zstandard.ZstdError as exc:  # not a zstd frame header at all
        raise CorruptObject("zstd frame header is damaged") from exc
    if declared not in (expected, -1):  # -1: size not in the frame header
        raise CorruptObject("zstd frame declares the wrong size")
    if expected == 0:
        return b""
    try:
        # The output buffer is at most the recorded size, whatever the frame claims: a
        # decompression bomb fails instead of allocating.
        out = _decompressor().decompress(data, max_output_size=expected)
    except zstandard.ZstdError as exc:
        raise CorruptObject(f"zstd stream is corrupt or decodes to the wrong length ({exc})") from exc
    if len(out) != expected:
        raise CorruptObject("zstd stream decoded to the wrong length")
    return out


def _decompressor() -> zstandard.ZstdDecompressor:
    cache = _COMPRESSORS.__dict__
    if "decompressor" not in cache:
        cache["decompressor"] = zstandard.ZstdDecompressor()
    return cache["decompressor"]
