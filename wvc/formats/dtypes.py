"""The safetensors dtype table: element width, numeric kind and torch name per dtype.

``kind`` picks the delta transform: ``float`` values are sign-magnitude bit patterns (the
ULP distance maps them to ordered integers first), ``int`` values subtract directly,
``bits`` (bool, packed sub-byte formats) are only XORed.
``exponent`` locates the exponent bits, the context that predicts how many units in the
last place an optimizer step moves a weight (docs/design.md, "Codec").
``rank`` is the position in safetensors' Rust ``Dtype`` enum, which orders tensors in a
file it writes (by rank descending, then by name); we need it to rebuild the exact bytes
``safetensors.torch.save`` would write for a state dict.
"""

from __future__ import annotations

from ..errors import UnsupportedTensor

from dataclasses import dataclass


@dataclass(frozen=True)
class DType:
    name: str
    width: int  # bytes per element
    kind: str  # "float" | "int" | "bits"
    torch_name: str | None
    rank: int
    exponent: tuple[int, int] | None = None  # (shift, mask) of the exponent field, floats only


_TABLE = [
    # name, width, kind, torch dtype attribute, rank in safetensors' enum, exponent field
    ("BOOL", 1, "bits", "bool", 0),
    ("U8", 1, "int", "uint8", 4),
    ("I8", 1, "int", "int8", 5),
    ("F8_E5M2", 1, "float", "float8_e5m2", 6, (2, 0x1F)),
    ("F8_E4M3", 1, "float", "float8_e4m3fn", 7, (3, 0xF)),
    ("F8_E8M0", 1, "bits", "float8_e8m0fnu", 8),
    ("I16", 2, "int", "int16", 9),
    ("U16", 2, "int", "uint16", 10),
    ("F16", 2, "float", "float16", 11, (10, 0x1F)),
    ("BF16", 2, "float", "bfloat16", 12, (7, 0xFF)),
    ("I32", 4, "int", "int32", 13),
    ("U32", 4, "int", "uint32", 14),
    ("F32", 4, "float", "float32", 15, (23, 0xFF)),
    ("F64", 8, "float", "float64", 17, (52, 0x7FF)),
    ("I64", 8, "int", "int64", 18),
    ("U64", 8, "int", "uint64", 19),
]

DTYPES: dict[str, DType] = {row[0]: DType(*row) for row in _TABLE}

# Blobs and safetensors headers are plain bytes: width 1, XOR/subtract only.
BYTES = DType("BYTES", 1, "bits", "uint8", -1)


def by_torch_dtype(torch_dtype) -> DType:
    name = str(torch_dtype).removeprefix("torch.")
    for dt in DTYPES.values():
        if dt.torch_name == name:
            return dt
    raise UnsupportedTensor(f"torch dtype {name} has no safetensors equivalent: wvc cannot store it "
                            "(convert the tensor, e.g. a complex one to torch.view_as_real)")


# -- float bit patterns as numbers ------------------------------------------------------------
# A float's bits are sign-magnitude; the codecs and the diff want them as integers whose order
# is the values' order. Both work on numpy arrays, torch tensors and Python ints alike.

def value_order(x, bits: int):
    """``bits``-wide float bit patterns (as signed or unsigned integers of any wider type) ->
    integers in the values' order: a negative value's magnitude bits are flipped. A bijection
    (an involution: applied twice it gives ``x`` back), so -0.0 sits just below +0.0; the
    delta codecs rely on it to be lossless."""
    return x ^ (-((x >> (bits - 1)) & 1) & ((1 << (bits - 1)) - 1))


def ulp_position(x, bits: int):
    """``bits``-wide float bit patterns (signed integers) -> their position in units in the
    last place: -0.0 and +0.0 are both 0, so the difference of two is their distance in ULPs
    (``wvc diff``'s measure). Not a bijection: for measuring, never for coding."""
    sign = x >> (bits - 1)  # 0, or -1 for a negative value (arithmetic shift)
    return (x ^ (sign & ((1 << (bits - 1)) - 1))) - sign
