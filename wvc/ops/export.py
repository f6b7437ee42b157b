"""Export: a version as Hugging Face-style sharded safetensors (``from_pretrained`` reads it).

A DCP commit (formats/dcp_tree.py) is reassembled tensor by tensor from its ranks'
shards; any other commit's safetensors tensors are taken as they are, and its other files
(config, tokenizer) copied. Shards hold tensors in name order up to ``max_shard_bytes``
(a tensor larger than that gets a shard of its own), named like transformers names them,
with ``model.safetensors.index.json`` when there is more than one. Memory is bounded by
the largest single tensor: each is built, written and dropped before the next.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from ..errors import CorruptObject, InvalidArgument, PathInTheWay
from ..formats import dcp_tree
from ..formats import safetensors as st
from ..formats.dtypes import DTYPES
from ..fsutil import atomic_write, atomic_writer, resolve_inside
from ..progress import NULL, Progress
from ..worktree.materialize import file_blocks, write_file

INDEX_NAME = "model.safetensors.index.json"
DEFAULT_MAX_SHARD_BYTES = 5_000_000_000  # transformers' default "5GB"


@dataclass(frozen=True)
class _Source:
    name: str
    dtype: str
    shape: tuple[int, ...]
    entry: object = None  # a TensorEntry (plain commit)
    shards: tuple = ()  # ((Shard, TensorEntry), ...) of a DCP item

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPES[self.dtype].width


def parse_size(text) -> int:
    """"5GB" -> 5e9, "500MiB" -> 500 * 2**20, "1000" -> 1000 (as transformers reads them)."""
    units = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
             "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
    s = str(text).strip().upper()
    number = s.rstrip("KMGTIB")
    try:
        value = int(float(number) * units[s[len(number):]])
    except (KeyError, ValueError) as exc:
        raise InvalidArgument(f"shard size {text!r}: use a number of bytes, or e.g. 5GB, 500MB, 2GiB") from exc
    if value <= 0:
        raise InvalidArgument(f"shard size {text!r} must be positive")
    return value


def export(repo, rev: str, out_dir, *, max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
           progress: Progress = NULL) -> dict:
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise PathInTheWay(f"output directory {out} is not empty")
    commit_id = repo.resolve(rev)
    tree = repo.tree_of(commit_id)
    files = tree.by_path()
    repo.store.ensure_local(tree.chunk_ids(), progress)
    if dcp_tree.METADATA_PATH in files:
        sources = _dcp_sources(repo, files)
        others = []
    else:
        sources, others = _plain_sources(tree)
    shards = _plan_shards(sources, max_shard_bytes)
    out.mkdir(parents=True, exist_ok=True)
    progress.start(sum(s.nbytes for s in sources) + sum(f.size for f in others), "export")
    for f in others:  # config, tokenizer, ... as they are
        write_file(repo.store, f, resolve_inside(out, f.path), progress)
    names = ["model.safetensors"] if len(shards) == 1 else \
        [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    weight_map = {}
    for name, shard in zip(names, shards):
        _write_shard(repo, out / name, shard, progress)
        weight_map.update({s.name: name for s in shard})
    total = sum(s.nbytes for s in sources)
    if len(shards) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        atomic_write(out / INDEX_NAME, json.dumps(index, indent=2, sort_keys=True).encode() + b"\n")
    progress.close()
    return {"commit": commit_id, "output": str(out), "shards": names, "tensors": len(sources),
            "total_bytes": total, "other_files": [f.path for f in others]}


def _dcp_sources(repo, files) -> list[_Source]:
    data = b"".join(file_blocks(repo.store, files[dcp_tree.METADATA_PATH]))
    layout = dcp_tree.DcpManifest.from_bytes(data)
    sources = []
    for fqn, item in sorted(layout.tensors.items()):
        pairs = []
        for s in item.shards:
            entry = files.get(s.file)
            t = next((t for t in entry.tensors if t.name == s.tensor), None) if entry else None
            if t is None or t.dtype != item.dtype or tuple(t.shape) != s.sizes:
                raise CorruptObject(f"{dcp_tree.METADATA_PATH}: shard {s.tensor!r} does not match the tree")
            pairs.append((s, t))
        covered = sum(math.prod(s.sizes) for s, _ in pairs)
        if covered != math.prod(item.size):  # replicated shards are saved once: each element once
            raise CorruptObject(f"{fqn}: its saved shards cover {covered} of {math.prod(item.size)} elements")
        sources.append(_Source(fqn, item.dtype, item.size, shards=tuple(pairs)))
    return sources


def _plain_sources(tree):
    sources, seen, others = [], set(), []
    for f in tree.files:
        if f.kind != "safetensors":
            others.append(f)
            continue
        for t in f.tensors:
            if t.name not in seen:  # as load_state_dict: the first file that has a name wins
                seen.add(t.name)
                sources.append(_Source(t.name, t.dtype, tuple(t.shape), entry=t))
    others = [f for f in others if not f.path.endswith(INDEX_NAME)]  # the old shards' index would lie
    return sorted(sources, key=lambda s: s.name), others


def _plan_shards(sources: list[_Source], limit: int) -> list[list[_Source]]:
    shards: list[list[_Source]] = [[]]
    size = 0
    for s in sources:
        if shards[-1] and size + s.nbytes > limit:
            shards.append([])
            size = 0
        shards[-1].append(s)
        size += s.nbytes
    return shards


def _write_shard(repo, path: Path, shard: list[_Source], progress: Progress) -> None:
    header_bytes, layout = st.build_header([(s.name, DTYPES[s.dtype], s.shape) for s in shard], {"format": "pt"})
    by_name = {s.name: s for s in shard}
    size = 8 + len(header_bytes) + (layout[-1].end if layout else 0)
    with atomic_writer(path, size_hint=size) as fh:
        fh.write(len(header_bytes).to_bytes(8, "little"))
        fh.write(header_bytes)
        for block in _shard_blocks(repo, [by_name[info.name] for info in layout]):  # data-offset order
            fh.write(block)
            progress.advance(len(block))


def _shard_blocks(repo, sources: list[_Source]):
    """The sources' bytes in order. A run of whole tensors is read through one ``get_many``,
    so the codec pool decodes ahead across them (a tensor at a time, a model of one-chunk
    tensors decoded on one core)."""
    run: list[_Source] = []
    for source in [*sources, None]:
        if source is not None and source.entry is not None:
            run.append(source)
            continue
        if run:
            yield from repo.store.get_many([c for r in run for c in r.entry.chunks])
            run = []
        if source is not None:
            yield from _tensor_blocks(repo, source)


def _tensor_blocks(repo, source: _Source):
    if source.entry is not None:
        yield from repo.store.get_many(source.entry.chunks)
        return
    import torch

    from ..read.tensors import tensor_from_chunks

    dtype = getattr(torch, DTYPES[source.dtype].torch_name)
    full = torch.empty(source.shape, dtype=dtype)
    for shard, entry in source.shards:
        region = full
        for dim, (offset, length) in enumerate(zip(shard.offsets, shard.sizes)):
            region = region.narrow(dim, offset, length)
        region.copy_(tensor_from_chunks(repo.store, entry, "cpu"))
    if full.numel():
        yield full.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
