"""What a version is: trees (its files, tensors and chunks) and commits, their canonical bytes, and validation.

No I/O here. ``to_bytes`` is canonical (sorted keys, compact, ASCII) so ids are stable
across machines; ``from_bytes`` treats its input as untrusted and checks every field, so a
tree fetched from a remote cannot name an unsafe path or a malformed id.
"""

from __future__ import annotations

import json
import math
from functools import cached_property
from dataclasses import dataclass, field, replace

from .chunk_spans import chunk_spans  # noqa: F401 - (trees check their chunk counts with it)
from .. import ids
from ..errors import FormatError
from ..formats.dtypes import DTYPES
from ..fsutil import folded_clashes, validate_relpath

FORMAT = 1  # commits
# 3: an entry may say "executable": true; 2: a file's hash is its content id
# (FileEntry.content_id); 1: a hash of its bytes. Every format is still read.
TREE_FORMAT = 3
TREE_FORMATS = (1, 2, 3)
MAX_OBJECT_BYTES = 1 << 30
# A tree lists a version's files; a model directory holds tens to thousands. Bounded so that a
# hostile tree (a million entries) is refused before each entry costs a parse, a database row
# and memory in every later `log` and `status`; 100,000 files of any size is far past real use.
MAX_TREE_FILES = 100_000
MAX_TREE_BYTES = 128 << 20  # a 1T-parameter fp32 model's tree (1M chunk ids) is ~70 MiB
MAX_METADATA_BYTES = 1 << 20
# Chunk sizes a new repository may use: every dtype width (1, 2, 4, 8 bytes) divides a
# multiple of 8, so chunk i of a tensor covers the same elements in every commit.
MIN_CHUNK_BYTES = 64
MAX_CHUNK_BYTES = 256 << 20
# The largest raw chunk wvc ever decodes: a chunk, or a safetensors header (at most 100 MB
# plus its 8 length bytes) stored whole. A declared size above it is refused before anything
# is allocated; an encoded payload never needs more than this plus its container's overhead.
MAX_RAW_CHUNK = MAX_CHUNK_BYTES
MAX_PAYLOAD = MAX_RAW_CHUNK + (1 << 20)


def check_chunk_bytes(n) -> int:
    """A new repository's chunk size, or FormatError naming the allowed range."""
    if type(n) is not int or not MIN_CHUNK_BYTES <= n <= MAX_CHUNK_BYTES or n % 8:
        raise FormatError(f"chunk size {n!r} is not allowed: use a multiple of 8 from {MIN_CHUNK_BYTES} "
                          f"to {MAX_CHUNK_BYTES} bytes")
    return n


def canonical_json(value) -> bytes:
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    ).encode("ascii")


@dataclass(frozen=True)
class TensorEntry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    chunks: tuple[str, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPES[self.dtype].width

    def to_json(self):
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape), "chunks": list(self.chunks)}


@dataclass(frozen=True)
class FileEntry:
    path: str
    kind: str  # "blob" | "safetensors"
    size: int
    # Tree format 2: the content id (below), checked when the tree is parsed. Format 1 (older
    # trees): the ids.FILE digest of the file's bytes, kept only so the tree keeps its id.
    hash: str
    chunks: tuple[str, ...] = ()  # blob chunks
    header: str | None = None  # safetensors: chunk id of the exact header bytes
    tensors: tuple[TensorEntry, ...] = ()  # safetensors: in data-offset order
    executable: bool = False  # the owner's x bit, as git records it (tree format 3)

    @classmethod
    def of(cls, path: str, kind: str, size: int, **listing) -> "FileEntry":
        """An entry whose hash is its content id."""
        entry = cls(path, kind, size, "", **listing)
        return cls(path, kind, size, entry.content_id, **listing)

    def with_content_id(self) -> "FileEntry":
        """This entry as tree format 2 records it (an entry of a format-1 tree, carried over)."""
        content_id = self.content_id
        return self if self.hash == content_id else replace(self, hash=content_id)

    @cached_property  # a tree's parse, checkout, status and write_file all ask for it
    def content_id(self) -> str:
        """The file's id, derived from its chunk list: the file is the concatenation of its
        chunks (safetensors: length prefix, header chunk, tensor chunks in order), and each
        chunk id is the hash of the chunk's bytes, so this identifies the bytes as a hash of
        them would, without a second pass over them (see docs/design.md, "Ids"). The
        executable bit is part of it, so a chmod +x is a change, as in git."""
        listing = self.to_json()
        del listing["path"], listing["hash"]
        return ids.digest(ids.FILE_LISTING, canonical_json(listing))

    def to_json(self):
        out = {"path": self.path, "kind": self.kind, "size": self.size, "hash": self.hash}
        if self.executable:  # absent when false: a plain file's entry reads as in format 2
            out["executable"] = True
        if self.kind == "blob":
            out["chunks"] = list(self.chunks)
        else:
            out["header"] = self.header
            out["tensors"] = [t.to_json() for t in self.tensors]
        return out

    def chunk_ids(self):
        if self.header:
            yield self.header
        yield from self.chunks
        for t in self.tensors:
            yield from t.chunks


@dataclass(frozen=True)
class Tree:
    files: tuple[FileEntry, ...]
    chunk_bytes: int
    format: int = TREE_FORMAT  # a tree read from the store keeps its own, and so its id

    def to_bytes(self) -> bytes:
        return self._canonical

    @cached_property  # (a commit asks for a tree's bytes and id several times: a model of
    def _canonical(self) -> bytes:  # 3,000 tensors took 5 ms a serialisation)
        return canonical_json(
            {"format": self.format, "chunk_bytes": self.chunk_bytes, "files": [f.to_json() for f in self.files]}
        )

    @cached_property
    def id(self) -> str:
        return ids.digest(ids.TREE, self.to_bytes())

    def forget_bytes(self) -> "Tree":
        """Drop the cached canonical bytes, keeping the id: a cache of many trees of a
        250,000-chunk model holds 2 MB a tree (ids shared between versions), not 17."""
        self.id  # noqa: B018 - (computed first: it needs the bytes)
        self.__dict__.pop("_canonical", None)
        return self

    def by_path(self) -> dict[str, FileEntry]:
        return {f.path: f for f in self.files}

    @property
    def logical_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def chunk_ids(self) -> set[str]:
        return {c for f in self.files for c in f.chunk_ids()}

    @classmethod
    def from_bytes(cls, data: bytes, expected_id: str | None = None) -> "Tree":
        if expected_id is not None and ids.digest(ids.TREE, data) != expected_id:
            raise FormatError(f"tree {ids.short(expected_id)} does not match its id")
        if len(data) > MAX_TREE_BYTES:
            raise FormatError(f"tree object is larger than {MAX_TREE_BYTES >> 20} MiB")
        raw = _load(data, "tree")
        _expect(raw, {"format", "chunk_bytes", "files"}, "tree")
        if raw["format"] not in TREE_FORMATS or type(raw["format"]) is not int:
            raise FormatError(f"tree format {raw['format']!r} is not supported")
        chunk_bytes = raw["chunk_bytes"]
        if type(chunk_bytes) is not int or not 8 <= chunk_bytes <= 1 << 30:
            raise FormatError("tree chunk_bytes out of range")
        if not isinstance(raw["files"], list):
            raise FormatError("tree files must be a list")
        if len(raw["files"]) > MAX_TREE_FILES:
            raise FormatError(f"tree lists {len(raw['files'])} files, more than wvc takes ({MAX_TREE_FILES})")
        files = tuple(_parse_file(f, chunk_bytes, raw["format"]) for f in raw["files"])
        paths = [f.path for f in files]
        if paths != sorted(paths) or len(set(paths)) != len(paths):
            raise FormatError("tree paths must be unique and sorted")
        _check_no_file_dir_clash(paths)
        if raw["format"] >= 2:
            for f in files:
                if f.hash != f.content_id:
                    raise FormatError(f"{f.path}: file hash does not match its chunk list")
        return cls(files, chunk_bytes, raw["format"])


@dataclass(frozen=True)
class Commit:
    tree: str
    parents: tuple[str, ...]
    author: str
    timestamp: int
    message: str
    metadata: dict = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        return canonical_json(
            {
                "format": FORMAT,
                "tree": self.tree,
                "parents": list(self.parents),
                "author": self.author,
                "timestamp": self.timestamp,
                "message": self.message,
                "metadata": self.metadata,
            }
        )

    @property
    def id(self) -> str:
        return ids.digest(ids.COMMIT, self.to_bytes())

    @property
    def summary(self) -> str:
        return self.message.splitlines()[0] if self.message else ""

    @classmethod
    def from_bytes(cls, data: bytes, expected_id: str | None = None) -> "Commit":
        if expected_id is not None and ids.digest(ids.COMMIT, data) != expected_id:
            raise FormatError(f"commit {ids.short(expected_id)} does not match its id")
        raw = _load(data, "commit")
        _expect(raw, {"format", "tree", "parents", "author", "timestamp", "message", "metadata"}, "commit")
        if raw["format"] != FORMAT:
            raise FormatError(f"commit format {raw['format']!r} is not supported")
        if not ids.is_object_id(raw["tree"]):
            raise FormatError("commit tree is not an object id")
        parents = raw["parents"]
        if not isinstance(parents, list) or len(parents) > 16 or not all(map(ids.is_object_id, parents)):
            raise FormatError("commit parents must be a list of object ids")
        if not isinstance(raw["author"], str) or not isinstance(raw["message"], str):
            raise FormatError("commit author and message must be strings")
        if type(raw["timestamp"]) is not int or not 0 <= raw["timestamp"] < 2**40:
            raise FormatError("commit timestamp out of range")
        if not isinstance(raw["metadata"], dict):
            raise FormatError("commit metadata must be an object")
        return cls(raw["tree"], tuple(parents), raw["author"], raw["timestamp"], raw["message"], raw["metadata"])


def first_parents(read_commit, commit_id: str | None, limit: int | None = None) -> list[str]:
    """``commit_id`` and its first parents, newest first (at most ``limit``): the one walk of a
    run's line, through ``read_commit(id) -> Commit`` (a repository's or a remote's)."""
    out: list[str] = []
    while commit_id is not None and (limit is None or len(out) < limit):
        out.append(commit_id)
        parents = read_commit(commit_id).parents
        commit_id = parents[0] if parents else None
    return out


def finite_number(value) -> float | None:
    """A metadata value as a float if it is a finite number (not a bool), else None. An int
    too large for a float (a 401-digit ``eval_loss``) is not one: float() of it overflows."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def check_metadata(metadata: dict) -> dict:
    """Commit metadata must be JSON (no NaN) and small; returns a normalised copy."""
    try:
        data = canonical_json(metadata)
    except (TypeError, ValueError) as exc:
        raise FormatError(f"commit metadata is not plain JSON: {exc}") from exc
    if len(data) > MAX_METADATA_BYTES:
        raise FormatError("commit metadata is larger than 1 MiB")
    return json.loads(data)


def _load(data: bytes, what: str):
    if len(data) > MAX_OBJECT_BYTES:
        raise FormatError(f"{what} object is too large")
    try:
        raw = json.loads(data.decode("ascii"), parse_constant=_reject)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise FormatError(f"{what} object is not canonical JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise FormatError(f"{what} object is not a JSON object")
    return raw


def _reject(name):
    raise ValueError(f"constant {name} not allowed")


def _expect(raw: dict, keys: set, what: str) -> None:
    if set(raw) != keys:
        raise FormatError(f"{what} has fields {sorted(raw)}, expected {sorted(keys)}")


def _ids(value, what) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(map(ids.is_object_id, value)):
        raise FormatError(f"{what} must be a list of object ids")
    return tuple(value)


def _parse_file(raw, chunk_bytes: int, tree_format: int) -> FileEntry:
    if not isinstance(raw, dict):
        raise FormatError("tree file entry is not an object")
    executable = False
    if tree_format >= 3 and "executable" in raw:
        if raw["executable"] is not True:  # written only when true: one spelling, one tree id
            raise FormatError("tree entry's executable must be true or absent")
        raw = {k: v for k, v in raw.items() if k != "executable"}
        executable = True
    kind = raw.get("kind")
    if kind == "blob":
        _expect(raw, {"path", "kind", "size", "hash", "chunks"}, "blob entry")
    elif kind == "safetensors":
        _expect(raw, {"path", "kind", "size", "hash", "header", "tensors"}, "safetensors entry")
    else:
        raise FormatError(f"unknown file kind {kind!r}")
    path = validate_relpath(raw["path"])
    size = raw["size"]
    if type(size) is not int or not 0 <= size < 2**53:
        raise FormatError(f"{path}: size out of range")
    if not ids.is_object_id(raw["hash"]):
        raise FormatError(f"{path}: hash is not an object id")
    if kind == "blob":
        chunks = _ids(raw["chunks"], f"{path}: chunks")
        if len(chunks) != len(chunk_spans(size, 1, chunk_bytes)):
            raise FormatError(f"{path}: chunk count does not match its size")
        return FileEntry(path, kind, size, raw["hash"], chunks=chunks, executable=executable)
    if not ids.is_object_id(raw["header"]):
        raise FormatError(f"{path}: header is not an object id")
    if not isinstance(raw["tensors"], list):
        raise FormatError(f"{path}: tensors must be a list")
    tensors = tuple(_parse_tensor(t, path, chunk_bytes) for t in raw["tensors"])
    return FileEntry(path, kind, size, raw["hash"], header=raw["header"], tensors=tensors, executable=executable)


def _parse_tensor(raw, path: str, chunk_bytes: int) -> TensorEntry:
    if not isinstance(raw, dict):
        raise FormatError(f"{path}: tensor entry is not an object")
    _expect(raw, {"name", "dtype", "shape", "chunks"}, f"{path}: tensor entry")
    if not isinstance(raw["name"], str) or raw["dtype"] not in DTYPES:
        raise FormatError(f"{path}: tensor has a bad name or dtype")
    shape = raw["shape"]
    if not isinstance(shape, list) or len(shape) > 64 or not all(type(d) is int and 0 <= d < 2**63 for d in shape):
        raise FormatError(f"{path}: tensor {raw['name']!r} has a bad shape")
    entry = TensorEntry(raw["name"], raw["dtype"], tuple(shape), _ids(raw["chunks"], f"{path}: chunks"))
    if entry.nbytes >= 2**53 or len(entry.chunks) != len(chunk_spans(entry.nbytes, DTYPES[entry.dtype].width, chunk_bytes)):
        raise FormatError(f"{path}: tensor {entry.name!r} chunk count does not match its shape")
    return entry


def _check_no_file_dir_clash(paths: list[str]) -> None:
    """``a`` and ``a/b`` cannot both be files; checkout would have to fail halfway. Nor may
    two paths fold to one name (``Config.json``, ``config.json``; NFC and NFD spellings):
    on macOS, Windows or an SMB share one would silently overwrite the other."""
    clashes = folded_clashes(paths)
    if clashes:
        a, b = clashes[0]
        raise FormatError(f"tree has {a!r} and {b!r}, one name on case-insensitive or Unicode-normalising "
                          "file systems (macOS, Windows, SMB shares)")
    names = set(paths)
    for p in paths:
        parts = p.split("/")
        for i in range(1, len(parts)):
            if "/".join(parts[:i]) in names:
                raise FormatError(f"tree has both a file and a directory named {'/'.join(parts[:i])!r}")
