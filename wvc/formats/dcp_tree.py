"""How a torch.distributed.checkpoint save is laid out in a wvc tree (no I/O, no torch).

A DCP commit is an ordinary tree, so log, show, diff, push, clone, fsck and gc need
nothing special:

    dcp/metadata.json               this layout (below): every item, its global shape and
                                    dtype, and where each saved shard lives
    dcp/rank-00003.safetensors      rank 3's tensor shards, one safetensors tensor each,
                                    named "<fqn>@<offset>,<offset>,..."
    dcp/rank-00003-bytes-0.bin      rank 3's non-tensor items (DCP's BytesIO state), one blob each

Each shard is a tensor of its own, chunked like any tensor, so a shard saved again at the
same offsets is delta-encoded against the parent's same shard. ``metadata.json`` may come
from a remote: it is parsed with bounds and every reference checked against the tree.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from ..errors import FormatError
from .dtypes import DTYPES

PREFIX = "dcp/"
METADATA_PATH = PREFIX + "metadata.json"
FORMAT = 1
MAX_METADATA_BYTES = 256 << 20
MAX_DIMS = 64


def rank_file(rank: int) -> str:
    return f"{PREFIX}rank-{rank:05d}.safetensors"


def bytes_file(rank: int, i: int) -> str:
    return f"{PREFIX}rank-{rank:05d}-bytes-{i}.bin"


def shard_name(fqn: str, offsets) -> str:
    return f"{fqn}@{','.join(str(int(o)) for o in offsets)}"


@dataclass(frozen=True)
class Shard:
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    file: str  # the rank file holding it
    tensor: str  # its tensor name there (shard_name)


@dataclass
class TensorItem:
    dtype: str  # a DTYPES name
    size: tuple[int, ...]  # the global shape
    shards: list[Shard] = field(default_factory=list)
    requires_grad: bool = False


@dataclass
class DcpManifest:
    tensors: dict[str, TensorItem] = field(default_factory=dict)
    blobs: dict[str, str] = field(default_factory=dict)  # fqn -> file of a BytesIO item

    def to_bytes(self) -> bytes:
        return json.dumps({
            "format": FORMAT,
            "tensors": {fqn: {"dtype": t.dtype, "size": list(t.size), "requires_grad": t.requires_grad,
                              "shards": [{"offsets": list(s.offsets), "sizes": list(s.sizes), "file": s.file,
                                          "tensor": s.tensor} for s in t.shards]}
                        for fqn, t in sorted(self.tensors.items())},
            "bytes": dict(sorted(self.blobs.items())),
        }, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")

    @classmethod
    def from_bytes(cls, data: bytes) -> "DcpManifest":
        if len(data) > MAX_METADATA_BYTES:
            raise FormatError(f"{METADATA_PATH} is larger than {MAX_METADATA_BYTES} bytes")
        try:
            raw = json.loads(data.decode("ascii"), parse_constant=_reject)
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise FormatError(f"{METADATA_PATH} is not JSON: {exc}") from exc
        if not isinstance(raw, dict) or set(raw) != {"format", "tensors", "bytes"} or raw["format"] != FORMAT:
            raise FormatError(f"{METADATA_PATH}: not a format-{FORMAT} layout")
        if not isinstance(raw["tensors"], dict) or not isinstance(raw["bytes"], dict):
            raise FormatError(f"{METADATA_PATH}: tensors and bytes must be objects")
        layout = cls()
        for fqn, item in raw["tensors"].items():
            layout.tensors[fqn] = _tensor_item(fqn, item)
        for fqn, path in raw["bytes"].items():
            layout.blobs[fqn] = _path(path, fqn)
        return layout

    def files(self) -> set[str]:
        return {s.file for t in self.tensors.values() for s in t.shards} | set(self.blobs.values())


def _reject(name):
    raise ValueError(f"constant {name} not allowed")


def _dims(value, what: str) -> tuple[int, ...]:
    if not isinstance(value, list) or len(value) > MAX_DIMS or not all(type(d) is int and 0 <= d < 2**62 for d in value):
        raise FormatError(f"{METADATA_PATH}: {what} must be a list of non-negative ints")
    return tuple(value)


def _path(value, fqn: str) -> str:
    if not isinstance(value, str) or not value.startswith(PREFIX) or ".." in value.split("/"):
        raise FormatError(f"{METADATA_PATH}: item {fqn!r} names a file outside {PREFIX}")
    return value


def _tensor_item(fqn: str, item) -> TensorItem:
    if not isinstance(item, dict) or set(item) != {"dtype", "size", "requires_grad", "shards"}:
        raise FormatError(f"{METADATA_PATH}: tensor item {fqn!r} has the wrong fields")
    if item["dtype"] not in DTYPES or not isinstance(item["requires_grad"], bool):
        raise FormatError(f"{METADATA_PATH}: tensor item {fqn!r} has a bad dtype")
    size = _dims(item["size"], f"{fqn!r} size")
    if not isinstance(item["shards"], list):
        raise FormatError(f"{METADATA_PATH}: {fqn!r} shards must be a list")
    out = TensorItem(item["dtype"], size, requires_grad=item["requires_grad"])
    for s in item["shards"]:
        if not isinstance(s, dict) or set(s) != {"offsets", "sizes", "file", "tensor"} or not isinstance(s["tensor"], str):
            raise FormatError(f"{METADATA_PATH}: a shard of {fqn!r} has the wrong fields")
        offsets, sizes = _dims(s["offsets"], "offsets"), _dims(s["sizes"], "sizes")
        if len(offsets) != len(size) or len(sizes) != len(size) or \
                any(o + n > d for o, n, d in zip(offsets, sizes, size)):
            raise FormatError(f"{METADATA_PATH}: a shard of {fqn!r} lies outside its tensor")
        out.shards.append(Shard(offsets, sizes, _path(s["file"], fqn), s["tensor"]))
    return out


def contiguous_rows(shard_sizes, offsets, lengths) -> tuple[int, int] | None:
    """The flat element range ``[begin, end)`` of a shard that a request for ``lengths`` at
    ``offsets`` (both within the shard) covers, when that region is contiguous in row-major
    order (it spans whole trailing dimensions, as a dim-0 split does); None otherwise."""
    dims = len(shard_sizes)
    if dims == 0:
        return 0, 1
    # the first dimension that is cut; every dimension after it must be whole
    for d in range(dims):
        if d > 0 and (offsets[d] != 0 or lengths[d] != shard_sizes[d]):
            if any(lengths[k] != 1 for k in range(d)):
                return None
            inner = range(d + 1, dims)
            if any(offsets[k] != 0 or lengths[k] != shard_sizes[k] for k in inner):
                return None
            stride = math.prod(shard_sizes[d + 1:])
            begin = sum(offsets[k] * math.prod(shard_sizes[k + 1:]) for k in range(d + 1))
            return begin, begin + lengths[d] * stride
    stride = math.prod(shard_sizes[1:])
    return offsets[0] * stride, (offsets[0] + lengths[0]) * stride
