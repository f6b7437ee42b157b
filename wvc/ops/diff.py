"""Diff: per-tensor change statistics between two versions (or a version and the working tree).

Statistics are streamed chunk by chunk; chunks with equal ids are skipped without decoding
(equal id means equal bytes). ``changed`` counts elements whose bit patterns differ, so a
NaN that stays the same NaN is unchanged and -0.0 vs 0.0 is a change.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from ..formats import safetensors as st
from ..formats.dtypes import DTYPES, ulp_position
from ..fsutil import selected
from ..model.chunk_spans import chunk_spans
from ..model.versions import FileEntry, TensorEntry
from ..progress import NULL, Progress
from ..worktree.scan import scan
from .status import working_hashes


@dataclass
class TensorDiff:
    file: str
    name: str
    status: str  # "modified" | "added" | "removed" | "reshaped" | "retyped" (dtype changed, maybe shape too)
    dtype: str
    shape: list[int]
    numel: int
    old_dtype: str | None = None  # reshaped / retyped: what it was
    old_shape: list[int] | None = None
    changed: int | None = None
    max_abs_delta: float | None = None
    max_ulps: int | None = None  # floats: the largest change in units of last place
    rel_l2: float | None = None
    stored_bytes: int | None = None

    def to_json(self):
        return dict(self.__dict__)


@dataclass
class FileDiff:
    path: str
    status: str  # "modified" | "added" | "removed"
    size_a: int | None
    size_b: int | None
    stored_bytes: int | None

    def to_json(self):
        return dict(self.__dict__)


class _TreeSide:
    """Chunks of a committed version."""

    def __init__(self, repo, tree, get=None):
        self.repo = repo
        self.files = {p: f.with_content_id() for p, f in tree.by_path().items()}  # hash: content id
        self.get = get or repo.store.get  # (ops/changes.py passes a cache shared along a history)

    def chunks(self, path, tensor):
        return list(tensor.chunks)

    def chunk(self, path, tensor, i, cid):
        return self.get(cid)


class _WorkSide:
    """Tensors of the working tree, read from the files themselves (nothing is stored)."""

    def __init__(self, repo, chunk_bytes: int):
        self.repo = repo
        self.files = {}
        self.headers = {}
        files = scan(repo.root).files
        hashes = working_hashes(repo, files, chunk_bytes)  # content ids, comparable with the tree's
        for path in files:
            full = repo.root / path
            entry = FileEntry(path, "blob", os.path.getsize(full), hashes[path])
            if path.endswith(".safetensors"):
                with open(full, "rb") as fh:
                    header = st.read_header(fh, os.fstat(fh.fileno()).st_size, path)
                self.headers[path] = header
                entry = FileEntry(
                    path, "safetensors", entry.size, entry.hash, header="",
                    tensors=tuple(TensorEntry(t.name, t.dtype.name, t.shape, ()) for t in header.tensors),
                )
            self.files[path] = entry

    def chunks(self, path, tensor):
        info = next(t for t in self.headers[path].tensors if t.name == tensor.name)
        return [None] * len(chunk_spans(info.nbytes, info.dtype.width, self.repo.chunk_bytes))

    def chunk(self, path, tensor, i, cid):
        header = self.headers[path]
        info = next(t for t in header.tensors if t.name == tensor.name)
        begin, end = chunk_spans(info.nbytes, info.dtype.width, self.repo.chunk_bytes)[i]
        with open(self.repo.root / path, "rb") as fh:
            fh.seek(header.data_start + info.begin + begin)
            return fh.read(end - begin)


class DiffResult(dict):
    """``{"files": [...], "tensors": [...]}``; renders as a table in a notebook."""

    def _repr_html_(self) -> str:
        from html import escape

        cols = ["file", "name", "status", "numel", "changed", "max_abs_delta", "max_ulps", "rel_l2", "stored_bytes"]
        rows = "".join("<tr>" + "".join(f"<td>{escape(str(t.get(k, '')))}</td>" for k in cols) + "</tr>"
                       for t in self.get("tensors", []))
        files = ", ".join(escape(f"{f['path']} ({f['status']})") for f in self.get("files", []))
        return (f"<p>{len(self.get('files', []))} files changed: {files}</p><table><tr>"
                + "".join(f"<th>{c}</th>" for c in cols) + f"</tr>{rows}</table>")


def diff(repo, rev_a=None, rev_b=None, *, stat: bool = False, paths=(), progress: Progress = NULL, get=None,
         tree_a=None, norms: dict | None = None) -> dict:
    """``paths``: only files at or under these (repository paths; "." is all). ``get``: chunk
    bytes by id (default: the store's); ``tree_a``: the first side's tree given directly (an
    empty one for a root commit); ``norms``: each chunk's sum of squares by id, kept between
    calls (ops/changes.py: a commit's chunks are its child's old ones)."""
    tree_a = tree_a if tree_a is not None else repo.tree_of(rev_a or "HEAD")
    a = _TreeSide(repo, tree_a, get)
    b = _TreeSide(repo, repo.tree_of(rev_b), get) if rev_b else _WorkSide(repo, tree_a.chunk_bytes)
    known_a = {c for f in a.files.values() for c in f.chunk_ids()}
    files, tensors = [], []
    wanted = tuple(paths)
    paths = sorted(set(a.files) | set(b.files))
    changed_paths = [p for p in paths if not (p in a.files and p in b.files and a.files[p].hash == b.files[p].hash)]
    if wanted:
        changed_paths = [p for p in changed_paths if selected(p, wanted)]
    if not stat:  # tensor statistics decode every chunk of a changed file: show how far along
        progress.start(sum(a.files[p].size for p in changed_paths if p in a.files), "diff")
    for path in changed_paths:
        fa, fb = a.files.get(path), b.files.get(path)
        status = "added" if fa is None else "removed" if fb is None else "modified"
        stored = _stored_bytes(repo, fb.chunk_ids(), known_a) if isinstance(b, _TreeSide) and fb else None
        files.append(FileDiff(path, status, fa.size if fa else None, fb.size if fb else None, stored))
        if stat:
            continue
        ta = {t.name: t for t in fa.tensors} if fa else {}
        tb = {t.name: t for t in fb.tensors} if fb else {}
        for name in list(ta) + [n for n in tb if n not in ta]:
            tensors.append(_tensor_diff(repo, a, b, path, ta.get(name), tb.get(name), known_a, progress,
                                        {} if norms is None else norms))
    progress.close()
    tensors = [t for t in tensors if t is not None]
    return DiffResult(files=[f.to_json() for f in files], tensors=[t.to_json() for t in tensors])


def _stored_bytes(repo, chunk_ids, known: set) -> int:
    """Bytes the store holds for these chunks, counting those not in ``known`` once."""
    rows = (repo.store.row(c) for c in set(chunk_ids) - known)
    return sum(r.length for r in rows if r)


_SAME_WIDTH_INT = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}


def ordered_bits(bits, width: int):
    """Float bit patterns (a same-width integer tensor) as value-ordered int64s: the
    sign-magnitude values in two's complement, so -0.0 and 0.0 are both 0 and the distance
    between two is in units of last place."""
    import torch

    if width == 1:  # (uint8 view: the sign is bit 7)
        s = bits.to(torch.int16)
        s = torch.where(s >= 128, s - 256, s)
    else:
        s = bits
    return ulp_position(s, 8 * width).to(torch.int64)


def _max_ulps(bits_a, bits_b, width: int) -> int:
    """The largest distance in units of last place between float bit patterns."""
    a, b = ordered_bits(bits_a, width), ordered_bits(bits_b, width)
    if width == 8:  # (int64 differences could overflow: in float64, at most the largest int64)
        return min(int(float((b.double() - a.double()).abs().max())), 2**63 - 1)
    return int((b - a).abs().max())


_KINDS = {"F32": 0, "F64": 1, "F16": 2, "BF16": 3}  # codec/_native.c change_stats


def _native_stats(dtype: str):
    """The C kernel for these floats' change statistics, or None (no build, another dtype)."""
    from ..codec import native

    kind = _KINDS.get(dtype)
    if kind is None or native.kernels is None or not hasattr(native.kernels, "change_stats"):
        return None
    return lambda x, y: native.kernels.change_stats(x, y, kind)


# Above this fraction of moved elements a chunk's delta statistics are taken over every
# element: gathering the moved ones costs more than it saves when nearly all moved (a dense
# optimizer step); below it (an RL step, a partial update) only the moved ones are touched.
DENSE_FRACTION = 0.25


def _tensor_diff(repo, a, b, path, ta, tb, known_a, progress: Progress = NULL, norms: dict | None = None):
    import torch

    t = tb or ta
    base = TensorDiff(path, t.name, "", t.dtype, list(t.shape), math.prod(t.shape))
    if ta is None or tb is None:
        base.status = "added" if ta is None else "removed"
        progress.advance(ta.nbytes if ta is not None else 0)
        return base
    if ta.dtype != tb.dtype or ta.shape != tb.shape:
        base.status = "retyped" if ta.dtype != tb.dtype else "reshaped"
        base.old_dtype, base.old_shape = ta.dtype, list(ta.shape)
        progress.advance(ta.nbytes)
        return base
    chunks_a = a.chunks(path, ta)
    chunks_b = b.chunks(path, tb)
    if chunks_a == chunks_b:
        progress.advance(ta.nbytes)
        return None
    dtype = getattr(torch, DTYPES[t.dtype].torch_name)
    width = DTYPES[t.dtype].width
    bits = getattr(torch, _SAME_WIDTH_INT[width])
    # float32 holds the squares of 16-bit floats exactly enough for a ratio; wider types in float64
    wide = torch.float64 if width > 2 else torch.float32
    changed, max_abs, max_ulps, sq_delta, sq_a = 0, 0.0, 0, 0.0, 0.0
    is_float = DTYPES[t.dtype].kind == "float"
    kernel = _native_stats(t.dtype)
    if kernel is not None:  # one pass in C over both chunks (the torch path below is its reference)
        for i, (ca, cb) in enumerate(zip(chunks_a, chunks_b)):
            raw_a = a.chunk(path, ta, i, ca)
            progress.advance(len(raw_a))
            if ca is not None and ca == cb:
                known = norms.get(ca) if norms is not None else None
                if known is None:
                    known = kernel(raw_a, raw_a)[1]
                    if norms is not None:
                        norms[ca] = known
                sq_a += known
                continue
            n, sq, sq_d, m_abs, m_ulps = kernel(raw_a, b.chunk(path, tb, i, cb))
            if norms is not None and ca is not None:
                norms[ca] = sq
            changed, sq_a, sq_delta = changed + n, sq_a + sq, sq_delta + sq_d
            max_abs, max_ulps = max(max_abs, m_abs), max(max_ulps, m_ulps)
    for i, (ca, cb) in enumerate(zip(chunks_a, chunks_b) if kernel is None else ()):
        raw_a = a.chunk(path, ta, i, ca)
        progress.advance(len(raw_a))
        ua = torch.frombuffer(bytearray(raw_a), dtype=torch.uint8)
        va = None
        known = norms.get(ca) if norms is not None and ca is not None else None
        if known is None:
            va = ua.view(dtype).to(wide)
            known = float(torch.nansum(va * va, dtype=torch.float64))
            if norms is not None and ca is not None:
                norms[ca] = known
        sq_a += known
        if ca is not None and ca == cb:
            continue
        ub = torch.frombuffer(bytearray(b.chunk(path, tb, i, cb)), dtype=torch.uint8)
        moved = ua.view(bits) != ub.view(bits)  # bit patterns, one compare per element
        n = int(moved.sum())
        changed += n
        if not n:
            continue
        if n > DENSE_FRACTION * moved.numel():  # every element: unmoved ones give a delta of 0
            va = ua.view(dtype).to(wide) if va is None else va
            d = torch.nan_to_num(ub.view(dtype).to(wide) - va, nan=0.0, posinf=0.0, neginf=0.0)
            if is_float:
                max_ulps = max(max_ulps, _max_ulps(ua.view(bits), ub.view(bits), width))
            max_abs = max(max_abs, float(d.abs().max()))
            sq_delta += float(torch.sum(d * d, dtype=torch.float64))
            continue
        # the moved elements only: a training step may move a few percent of them
        d = ub.view(dtype)[moved].to(wide) - ua.view(dtype)[moved].to(wide)
        if is_float:
            max_ulps = max(max_ulps, _max_ulps(ua.view(bits)[moved], ub.view(bits)[moved], width))
        d = torch.nan_to_num(d, nan=0.0, posinf=0.0, neginf=0.0)  # (a non-finite delta is not a number)
        max_abs = max(max_abs, float(d.abs().max()))
        sq_delta += float(torch.sum(d * d, dtype=torch.float64))
    base.status = "modified"
    base.changed = changed
    base.max_abs_delta = max_abs
    base.max_ulps = max_ulps if is_float else None
    base.rel_l2 = math.sqrt(sq_delta / sq_a) if sq_a > 0 else (0.0 if sq_delta == 0 else None)
    if isinstance(b, _TreeSide):
        base.stored_bytes = _stored_bytes(repo, chunks_b, known_a)
    return base
