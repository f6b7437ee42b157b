"""Baselines, computed on exactly the bytes wvc stores, pair by pair (base file -> new file).

Each returns the bytes it would store for the new version given the base. Tensors are
matched by name; a tensor with no same-shaped base is coded without delta.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import torch
import zstandard
from safetensors import safe_open

_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def tensors(path: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(path), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def raw_int(t: torch.Tensor) -> torch.Tensor:
    flat = t.contiguous().reshape(-1)
    return flat.view(_INT[flat.element_size()]) if flat.numel() else flat.view(torch.uint8)


def z3(data) -> int:
    return len(zstandard.ZstdCompressor(level=3).compress(memoryview(np.ascontiguousarray(data))))


def full_copy(base: Path | None, new: Path) -> int:
    return new.stat().st_size


def zstd3_file(base, new: Path) -> int:
    return len(zstandard.ZstdCompressor(level=3, threads=2).compress(new.read_bytes()))


def _planes(x: torch.Tensor) -> list[np.ndarray]:
    w = x.element_size()
    p = x.view(torch.uint8).reshape(-1, w).T.contiguous().numpy()
    return [p[i] for i in range(w)]


def byte_grouping(base, new: Path) -> int:
    """ZipNN's idea without its Huffman coder: byte planes per tensor, zstd-3, no delta."""
    return sum(sum(z3(p) for p in _planes(raw_int(t))) for t in tensors(new).values() if t.numel())


def zipnn_package(base, new: Path) -> int | None:
    try:
        from zipnn import ZipNN
    except ImportError:
        return None
    total = 0
    codecs = {}
    for t in tensors(new).values():
        if not t.numel():
            continue
        key = {torch.bfloat16: "bfloat16", torch.float32: "float32", torch.float16: "float16"}.get(t.dtype)
        if key is None:
            total += z3(t.contiguous().reshape(-1).view(torch.uint8).numpy())
            continue
        zpn = codecs.setdefault(key, ZipNN(input_format="byte", bytearray_dtype=key))
        total += len(zpn.compress(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()))
    return total


def bitx(base: Path | None, new: Path) -> int:
    """ZipLLM's BitX, from its description: XOR against the base, split the result into an
    exponent stream and a sign+mantissa stream, zstd-3 each (non-floats: XOR + zstd-3)."""
    old = tensors(base) if base else {}
    total = 0
    for name, t in tensors(new).items():
        if not t.numel():
            continue
        x = raw_int(t)
        b = old.get(name)
        if b is not None and b.shape == t.shape and b.dtype == t.dtype:
            x = x ^ raw_int(b)
        if t.dtype == torch.bfloat16 or t.dtype == torch.float16:
            ebits = 8 if t.dtype == torch.bfloat16 else 5
            mbits = 15 - ebits
            xi = x.to(torch.int32) & 0xFFFF
            exp = ((xi >> mbits) & ((1 << ebits) - 1)).to(torch.uint8)
            sm = (((xi >> 15) & 1) << mbits | (xi & ((1 << mbits) - 1))).to(torch.int16)
            total += z3(exp.numpy()) + sum(z3(p) for p in _planes(sm))
        elif t.dtype == torch.float32:
            xi = x.to(torch.int64) & 0xFFFFFFFF
            exp = ((xi >> 23) & 0xFF).to(torch.uint8)
            sm = (((xi >> 31) & 1) << 23 | (xi & 0x7FFFFF)).to(torch.int32)
            total += z3(exp.numpy()) + sum(z3(p) for p in _planes(sm)[:3])
        else:
            total += z3(x.view(torch.uint8).numpy())
    return total


def sparse_index_value(base: Path | None, new: Path) -> int:
    """TRL's delta weight sync: int32 index + raw new value of every changed element."""
    old = tensors(base) if base else {}
    total = 0
    for name, t in tensors(new).items():
        b = old.get(name)
        if b is None or b.shape != t.shape or b.dtype != t.dtype:
            total += t.numel() * t.element_size()
            continue
        changed = int((raw_int(t) != raw_int(b)).sum()) if t.numel() else 0
        total += changed * (4 + t.element_size())
    return total


def cdc_dedup(base: Path | None, new: Path, avg: int = 65536) -> int:
    """Xet-like content-defined chunking (~64 KB): bytes of new chunks absent from the base."""
    from fastcdc import fastcdc

    def chunks(path):
        return {hashlib.blake2b(c.data, digest_size=16).digest(): c.length
                for c in fastcdc(str(path), min_size=avg // 4, avg_size=avg, max_size=avg * 4, fat=True)}

    seen = chunks(base) if base else {}
    return sum(n for h, n in chunks(new).items() if h not in seen)


BASELINES = {
    "full copy (LFS/DVC)": full_copy,
    "zstd-3 file": zstd3_file,
    "byte grouping (ZipNN idea)": byte_grouping,
    "zipnn package": zipnn_package,
    "BitX (ZipLLM)": bitx,
    "sparse idx+value (TRL)": sparse_index_value,
    "CDC dedup (Xet-like)": cdc_dedup,
}
