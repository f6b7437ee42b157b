"""Chunk transforms with torch: byte planes, XOR and ULP-distance deltas.

Every transform works on the integer view of the bytes, so it is lossless for any bit
pattern (NaN payloads, -0.0, subnormals) and any dtype; integer arithmetic wraps, and
wrapping subtraction is exactly invertible by wrapping addition.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from ..errors import CorruptObject
from ..formats.dtypes import DType
from .container import Method, compress_plane, pack, peek, plane_bytes

_INT = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

# Sampling: for big chunks, pick the method on a slice and encode only the winner.
SAMPLE_BYTES = 256 * 1024


@dataclass(frozen=True)
class Encoded:
    payload: bytes
    method: Method

    @property
    def uses_base(self) -> bool:
        return self.method.uses_base


def _as_int(buf, width: int, device: str) -> torch.Tensor:
    if len(buf) == 0:
        return torch.empty(0, dtype=_INT[width], device=device)
    with warnings.catch_warnings():  # frombuffer warns about read-only buffers; we never write
        warnings.simplefilter("ignore")
        t = torch.frombuffer(buf, dtype=_INT[width])
    return t.to(device, non_blocking=False) if device != "cpu" else t


def _planes(x: torch.Tensor, width: int) -> list:
    if width == 1:
        return [x.view(torch.uint8).cpu().numpy()]
    p = x.view(torch.uint8).reshape(-1, width).T.contiguous().cpu().numpy()
    return [p[k] for k in range(width)]


def _unplanes(planes: list, width: int) -> torch.Tensor:
    if width == 1:
        return _as_int(planes[0], 1, "cpu")
    stacked = torch.stack([_as_int(p, 1, "cpu").view(torch.uint8) for p in planes])
    return stacked.T.contiguous().reshape(-1).view(_INT[width])


def _ordered(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Sign-magnitude float bits -> integers in value order (an involution)."""
    return x ^ ((x >> (bits - 1)) & ((1 << (bits - 1)) - 1))


def _zigzag(d: torch.Tensor, bits: int) -> torch.Tensor:
    return (d << 1) ^ (d >> (bits - 1))


def _unzigzag(z: torch.Tensor, bits: int) -> torch.Tensor:
    logical = (z >> 1) & ((1 << (bits - 1)) - 1)
    return logical ^ -(z & 1)


def _transform(method: Method, x: torch.Tensor, b: torch.Tensor | None, bits: int) -> torch.Tensor:
    if method in (Method.RAW, Method.PLANES):
        return x
    if method is Method.XOR:
        return x ^ b
    if method is Method.ULP:
        return _zigzag(_ordered(x, bits) - _ordered(b, bits), bits)
    if method is Method.SUB:
        return _zigzag(x - b, bits)
    raise AssertionError(method)


def _inverse(method: Method, y: torch.Tensor, b: torch.Tensor | None, bits: int) -> torch.Tensor:
    if method in (Method.RAW, Method.PLANES):
        return y
    if method is Method.XOR:
        return y ^ b
    if method is Method.ULP:
        return _ordered(_unzigzag(y, bits) + _ordered(b, bits), bits)
    if method is Method.SUB:
        return _unzigzag(y, bits) + b
    raise AssertionError(method)


def candidate_methods(dtype: DType, has_base: bool) -> list[Method]:
    full = Method.PLANES if dtype.width > 1 else Method.RAW
    if not has_base:
        return [full]
    delta = {"float": Method.ULP, "int": Method.SUB}.get(dtype.kind)
    return [full, Method.XOR] + ([delta] if delta else [])


def _encode_with(method: Method, x, b, width: int, level: int) -> bytes:
    y = _transform(method, x, b, width * 8)
    planes = [compress_plane(p, level) for p in _planes(y, width)]
    return pack(method, width, x.numel() * width, planes)


def encode_chunk(
    raw, dtype: DType, base=None, *, device: str = "cpu", level: int = 1, method: Method | None = None
) -> Encoded:
    """Smallest encoding of ``raw``; ``method`` forces one (tests use it to cover each)."""
    raw = memoryview(raw).cast("B")
    width = dtype.width
    if len(raw) % width:
        raise ValueError("chunk is not a whole number of elements")
    if base is not None and len(base) != len(raw):
        base = None  # shapes changed: no element-wise delta
    x = _as_int(raw, width, device)
    b = _as_int(memoryview(base).cast("B"), width, device) if base is not None else None
    methods = [method] if method is not None else candidate_methods(dtype, b is not None)
    if len(methods) > 1 and len(raw) > 2 * SAMPLE_BYTES:
        methods = [_best_on_sample(methods, x, b, width, level)]
    best = None
    for method in methods:
        payload = _encode_with(method, x, b, width, level)
        if best is None or len(payload) < len(best.payload):
            best = Encoded(payload, method)
    return best


def _best_on_sample(methods, x, b, width, level) -> Method:
    """Cheap model selection: encode a few spread slices with each method, keep the best."""
    n = x.numel()
    per = SAMPLE_BYTES // width // 4
    starts = [0, n // 3, (2 * n) // 3, max(0, n - per)]
    idx = torch.cat([torch.arange(s, min(s + per, n), device=x.device) for s in starts])
    xs, bs = x[idx], b[idx]
    return min(methods, key=lambda m: len(_encode_with(m, xs, bs, width, level)))


def decode_chunk(payload, raw_size: int, base=None) -> bytes:
    info = peek(payload)
    if info.raw_size != raw_size:
        raise CorruptObject(f"payload holds {info.raw_size} bytes, expected {raw_size}")
    if raw_size == 0:
        return b""
    planes = [plane_bytes(payload, info, k) for k in range(info.width)]
    y = _unplanes(planes, info.width)
    b = None
    if info.method.uses_base:
        if base is None or len(base) != raw_size:
            raise CorruptObject("delta payload without a matching base chunk")
        b = _as_int(memoryview(base).cast("B"), info.width, "cpu")
    x = _inverse(info.method, y, b, info.width * 8)
    return x.view(torch.uint8).numpy().tobytes()
