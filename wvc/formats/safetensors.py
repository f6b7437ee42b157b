"""A bounded, validating parser for the safetensors header (no torch, no mmap).

A safetensors file is ``u64 little-endian N`` + ``N bytes of JSON header`` + data. The
header is untrusted: we cap its size before reading it, reject duplicate keys (which
``json`` would silently merge), check every dtype, shape and offset, and require that the
tensors tile the data section exactly (no overlap, no hole, nothing trailing), as the
reference implementation does. The exact header bytes are kept so a checkout rebuilds
the file byte for byte, padding included.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass

from ..errors import SafetensorsFormatError
from .dtypes import DTYPES, DType

MAX_HEADER_BYTES = 100 * 1024 * 1024  # the reference implementation's limit
MAX_TENSORS = 1_000_000
MAX_RANK = 64
MAX_NAME_BYTES = 4096
METADATA_KEY = "__metadata__"


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: DType
    shape: tuple[int, ...]
    begin: int  # offset into the data section
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class SafetensorsHeader:
    header_bytes: bytes  # the JSON exactly as in the file, padding included
    metadata: dict[str, str] | None
    tensors: tuple[TensorInfo, ...]  # in data-offset order
    data_size: int

    @property
    def data_start(self) -> int:
        return 8 + len(self.header_bytes)

    @property
    def file_size(self) -> int:
        return self.data_start + self.data_size


def _no_duplicates(pairs):
    out = {}
    for key, value in pairs:
        if key in out:
            raise SafetensorsFormatError(f"duplicate key {key!r} in header")
        out[key] = value
    return out


def read_header_length(prefix: bytes, file_size: int, where: str) -> int:
    if len(prefix) < 8:
        raise SafetensorsFormatError(f"{where}: file too short for a safetensors header")
    (n,) = struct.unpack("<Q", prefix[:8])
    if n == 0 or n > MAX_HEADER_BYTES:
        raise SafetensorsFormatError(f"{where}: header length {n} out of bounds")
    if 8 + n > file_size:
        raise SafetensorsFormatError(f"{where}: header length {n} runs past the end of the file")
    return n


def parse_header(header_bytes: bytes, data_size: int, where: str = "file") -> SafetensorsHeader:
    """Validate ``header_bytes`` against a data section of ``data_size`` bytes."""
    try:
        text = header_bytes.decode("utf-8")
        raw = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_bad_constant)
    except SafetensorsFormatError as exc:
        raise SafetensorsFormatError(f"{where}: {exc}") from exc
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise SafetensorsFormatError(f"{where}: header is not valid JSON ({exc})") from exc
    if not isinstance(raw, dict):
        raise SafetensorsFormatError(f"{where}: header is not a JSON object")
    if len(raw) > MAX_TENSORS:
        raise SafetensorsFormatError(f"{where}: too many tensors ({len(raw)})")

    metadata = raw.pop(METADATA_KEY, None)
    if metadata is not None:
        if not isinstance(metadata, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
        ):
            raise SafetensorsFormatError(f"{where}: __metadata__ must map strings to strings")

    tensors = [_parse_tensor(name, spec, where) for name, spec in raw.items()]
    tensors.sort(key=lambda t: (t.begin, t.end))
    cursor = 0
    for t in tensors:
        if t.begin != cursor:
            problem = "overlap" if t.begin < cursor else "a hole"
            raise SafetensorsFormatError(
                f"{where}: tensor {t.name!r} data offsets leave {problem} at byte {cursor}"
            )
        cursor = t.end
    if cursor != data_size:
        raise SafetensorsFormatError(
            f"{where}: tensors cover {cursor} bytes but the data section has {data_size}"
        )
    return SafetensorsHeader(bytes(header_bytes), metadata, tuple(tensors), data_size)


def _bad_constant(name):
    raise ValueError(f"non-standard JSON constant {name}")


def _parse_tensor(name: str, spec: object, where: str) -> TensorInfo:
    if len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES or "\x00" in name:
        raise SafetensorsFormatError(f"{where}: invalid tensor name {name[:60]!r}")
    if not isinstance(spec, dict) or set(spec) != {"dtype", "shape", "data_offsets"}:
        raise SafetensorsFormatError(
            f"{where}: tensor {name!r} must have exactly dtype, shape and data_offsets"
        )
    dtype = DTYPES.get(spec["dtype"]) if isinstance(spec["dtype"], str) else None
    if dtype is None:
        raise SafetensorsFormatError(f"{where}: tensor {name!r} has unknown dtype {spec['dtype']!r}")
    shape = spec["shape"]
    if (
        not isinstance(shape, list)
        or len(shape) > MAX_RANK
        or not all(type(d) is int and 0 <= d < 2**63 for d in shape)
    ):
        raise SafetensorsFormatError(f"{where}: tensor {name!r} has an invalid shape {shape!r}")
    offsets = spec["data_offsets"]
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(type(o) is int and 0 <= o < 2**63 for o in offsets)
        or offsets[0] > offsets[1]
    ):
        raise SafetensorsFormatError(f"{where}: tensor {name!r} has invalid data_offsets")
    numel = math.prod(shape)
    if numel * dtype.width != offsets[1] - offsets[0]:
        raise SafetensorsFormatError(
            f"{where}: tensor {name!r} shape {shape} x {dtype.name} needs "
            f"{numel * dtype.width} bytes but data_offsets span {offsets[1] - offsets[0]}"
        )
    return TensorInfo(name, dtype, tuple(shape), offsets[0], offsets[1])


def read_header(fh, file_size: int, where: str) -> SafetensorsHeader:
    """Read and validate the header of an open binary file of ``file_size`` bytes."""
    fh.seek(0)
    n = read_header_length(fh.read(8), file_size, where)
    header_bytes = fh.read(n)
    if len(header_bytes) != n:
        raise SafetensorsFormatError(f"{where}: truncated header")
    return parse_header(header_bytes, file_size - 8 - n, where)


READ_BYTES = 64 << 20  # one read call at most (a read past 2 GiB is cut short by the kernel)


def read_tensor_into(fh, header: SafetensorsHeader, tensor: TensorInfo, into: memoryview, where: str) -> None:
    """Read ``tensor``'s bytes from the open file ``fh`` (unbuffered; ``header`` its header)
    into ``into`` (writable, ``tensor.nbytes`` long), by plain reads: no mapping of the file."""
    if len(into) != tensor.nbytes:
        raise ValueError(f"{where}: tensor {tensor.name} holds {tensor.nbytes} bytes, not {len(into)}")
    fh.seek(header.data_start + tensor.begin)
    done = 0
    while done < tensor.nbytes:
        got = fh.readinto(into[done : done + READ_BYTES])
        if not got:
            raise SafetensorsFormatError(f"{where} is shorter than its header says (tensor {tensor.name})")
        done += got


def build_header(tensors: list[tuple[str, DType, tuple[int, ...]]], metadata: dict | None) -> tuple[bytes, list[TensorInfo]]:
    """The header ``safetensors.torch.save`` writes for these tensors, and their layout.

    Tensors go in (dtype rank descending, name) order; the JSON is compact and padded with
    spaces to a multiple of 8 bytes. With two or more ``metadata`` keys the library's own
    order is a Rust HashMap's (random per process), so only 0 or 1 keys can match it. Keeping this identical to the library means a commit
    from a state dict has the same tree id as a commit of the saved file.
    """
    ordered = sorted(tensors, key=lambda t: (-t[1].rank, t[0]))
    header: dict[str, object] = {}
    if metadata is not None:
        header[METADATA_KEY] = metadata
    infos = []
    cursor = 0
    for name, dtype, shape in ordered:
        size = math.prod(shape) * dtype.width
        header[name] = {"dtype": dtype.name, "shape": list(shape), "data_offsets": [cursor, cursor + size]}
        infos.append(TensorInfo(name, dtype, tuple(shape), cursor, cursor + size))
        cursor += size
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return text, infos
