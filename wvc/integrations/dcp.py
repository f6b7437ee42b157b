"""wvc as a torch.distributed.checkpoint (DCP) storage layer: many ranks, one commit.

    import torch.distributed.checkpoint as dcp
    from wvc.integrations.dcp import WvcStorageReader, WvcStorageWriter

    dcp.save(state_dict, storage_writer=WvcStorageWriter("ckpt", message=f"step {step}"))
    dcp.load(state_dict, storage_reader=WvcStorageReader("ckpt"))               # any world size
    dcp.load(state_dict, storage_reader=WvcStorageReader("hf://team/run", "main"))  # range reads

Saving: every rank encodes its own write items (tensor shards with their offsets, and
DCP's BytesIO items) as wvc chunks, each shard delta-encoded against the same shard (same
FQN, same offsets) of the parent commit, and seals its own pack in ``.wvc/packs`` of the
shared repository. Nothing is gathered: a rank sees only its shards. The coordinator then
records every rank's pack and objects, one tree (formats/dcp_tree.py) and one commit in
one transaction, moving the branch by compare-and-swap, exactly as a commit does
(docs/design.md, "DCP saves"). Only the coordinator writes the database; a rank killed at
any point leaves packs nothing refers to, which gc removes.

Loading serves any rank's read plan from the commit, resharding included: each request
reads the chunks of the saved shard that overlap it (the whole shard only when the
requested region is not contiguous in it). From a remote, every chunk is a range read,
verified against its id, so ranks of a resumed job download about one copy between them.
"""

from __future__ import annotations

import dataclasses
import io
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, ChunkStorageMetadata, Metadata,
                                                   MetadataIndex, StorageMeta, TensorProperties,
                                                   TensorStorageMetadata)
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, SavePlan, WriteItemType
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from ..api import Repo
from ..codec.device_choice import commit_device
from ..errors import FormatError
from ..formats import dcp_tree
from ..formats.dtypes import BYTES, DTYPES, by_torch_dtype
from ..model.chunk_spans import chunk_spans, tensor_spans
from ..model.versions import Commit, FileEntry, Tree, check_metadata
from ..ops.commit import default_author
from ..progress import NULL
from ..remotes.urls import local_repository
from ..worktree.chunking import TreeBuilder


@dataclass(frozen=True)
class _RankPlan:
    """What the coordinator tells each rank in the global plan."""

    rank: int
    parent: str | None  # the commit every rank deltas against (the branch tip at plan time)


@dataclass
class _ItemRef:
    """A write result's storage data: where the item went, and (on one result per rank)
    what that rank wrote, for the coordinator to record."""

    file: str
    tensor: str | None = None
    rank_files: list = field(default_factory=list)  # FileEntry objects of this rank
    pack: tuple | None = None
    rows: list = field(default_factory=list)
    stored_bytes: int = 0


class WvcStorageWriter(StorageWriter):
    def __init__(self, repo_path, message: str = "dcp save", branch: str | None = None,
                 metadata: dict | None = None, device: str = "auto", author: str | None = None):
        super().__init__()
        self.repo_path = Path(repo_path)
        self.message = message
        self.branch = branch
        self.metadata = check_metadata(metadata or {})
        self.device = device
        self.author = author
        self.is_coordinator = False
        self.commit: str | None = None  # the coordinator's new commit, after finish
        self._parent: str | None = None
        self.stored_bytes = 0

    # -- the protocol --------------------------------------------------------------------------
    def reset(self, checkpoint_id=None) -> None:
        self.commit = None

    def set_up_storage_writer(self, is_coordinator: bool, *args, **kwargs) -> None:
        self.is_coordinator = is_coordinator
        if is_coordinator and not (self.repo_path / ".wvc").is_dir():
            Repo.init(self.repo_path).close()  # the other ranks open it after the planning collective

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        with Repo.open(self.repo_path) as repo:
            self._parent = repo.branch_tip(self._branch(repo))  # finish moves the branch from here (CAS)
        return [dataclasses.replace(p, storage_data=_RankPlan(i, self._parent)) for i, p in enumerate(plans)]

    def write_data(self, plan: SavePlan, planner) -> Future:
        info: _RankPlan = plan.storage_data
        results = self._write_rank(info, plan.items, planner) if plan.items else []
        fut: Future = Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        with Repo.open(self.repo_path) as repo:
            self.commit, self.stored_bytes = _record(repo, self, metadata, results)

    def storage_meta(self) -> StorageMeta | None:
        return StorageMeta(checkpoint_id=str(self.repo_path))

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        return False  # chosen explicitly, never inferred from a checkpoint_id

    # -- one rank's items ----------------------------------------------------------------------
    def _branch(self, repo) -> str:
        return self.branch or repo.head_branch() or "main"

    def _write_rank(self, info: _RankPlan, items, planner) -> list[WriteResult]:
        with Repo.open(self.repo_path) as repo:
            parent_tree = repo.tree_of(info.parent) if info.parent else None
            chunk_bytes = parent_tree.chunk_bytes if parent_tree else repo.chunk_bytes
            parents = parent_tree.by_path() if parent_tree else {}
            path = dcp_tree.rank_file(info.rank)
            tensors = [i for i in items if i.type != WriteItemType.BYTE_IO]
            blobs = [i for i in items if i.type == WriteItemType.BYTE_IO]
            results, files = [], []
            with repo.chunk_writer(device=commit_device(self.device), max_chain=repo.max_chain) as writer:
                snap = TreeBuilder(writer, parent_tree, chunk_bytes, NULL)
                if tensors:
                    entry, names = _write_tensors(snap, path, tensors, planner)
                    files.append(entry)
                    results += [WriteResult(index=i.index, size_in_bytes=_nbytes(i), storage_data=_ItemRef(path, n))
                                for i, n in zip(tensors, names)]
                for k, item in enumerate(blobs):
                    blob_path = dcp_tree.bytes_file(info.rank, k)
                    data = planner.resolve_data(item).getvalue()
                    files.append(_write_blob(writer, blob_path, data, chunk_bytes, parents.get(blob_path)))
                    results.append(WriteResult(index=item.index, size_in_bytes=len(data),
                                               storage_data=_ItemRef(blob_path)))
                pack, rows = writer.finish()
            head = results[0].storage_data
            head.rank_files, head.pack, head.rows, head.stored_bytes = files, pack, rows, writer.stored_bytes
            return results


def _nbytes(item) -> int:
    return math.prod(item.tensor_data.chunk.sizes) * by_torch_dtype(item.tensor_data.properties.dtype).width


def _write_tensors(snap: TreeBuilder, path: str, items, planner) -> tuple[FileEntry, list[str]]:
    """This rank's shards as one safetensors file entry (nothing written but chunks): each
    shard a tensor named ``<fqn>@<offsets>``, so the parent's same shard is its delta base."""
    data = {dcp_tree.shard_name(item.index.fqn, item.tensor_data.chunk.offsets): planner.resolve_data(item)
            for item in items}
    return snap.state_dict_file(data, path), list(data)


def _write_blob(writer, path: str, data: bytes, chunk_bytes: int, parent: FileEntry | None) -> FileEntry:
    base = parent.chunks if parent is not None and parent.kind == "blob" else ()
    chunks = tuple(writer.put(data[b:e], BYTES, base[i] if i < len(base) else None)
                   for i, (b, e) in enumerate(chunk_spans(len(data), 1, chunk_bytes)))
    return FileEntry.of(path, "blob", len(data), chunks=chunks)


def _record(repo, w: WvcStorageWriter, metadata: Metadata, results) -> tuple[str, int]:
    """The coordinator: the layout, the tree and the commit, in one transaction."""
    refs = {r.index: r.storage_data for rank in results for r in rank}
    files = [f for rank in results if rank for f in rank[0].storage_data.rank_files]
    layout = dcp_tree.DcpManifest()
    for fqn, md in metadata.state_dict_metadata.items():
        if isinstance(md, BytesStorageMetadata):
            layout.blobs[fqn] = refs[MetadataIndex(fqn)].file
            continue
        item = dcp_tree.TensorItem(by_torch_dtype(md.properties.dtype).name, tuple(md.size),
                                        requires_grad=bool(md.properties.requires_grad))
        for chunk in md.chunks:
            ref = refs[MetadataIndex(fqn, chunk.offsets)]
            item.shards.append(dcp_tree.Shard(tuple(chunk.offsets), tuple(chunk.sizes), ref.file, ref.tensor))
        layout.tensors[fqn] = item
    branch = w._branch(repo)
    parent = w._parent  # what every rank deltas against; a save that landed since fails the CAS
    with repo.chunk_writer() as writer:
        data = layout.to_bytes()
        parent_tree = repo.tree_of(parent) if parent else None
        old = parent_tree.by_path().get(dcp_tree.METADATA_PATH) if parent_tree else None
        chunk_bytes = parent_tree.chunk_bytes if parent_tree else repo.chunk_bytes
        files.append(_write_blob(writer, dcp_tree.METADATA_PATH, data, chunk_bytes, old))
        pack, rows = writer.finish()
    if parent_tree is not None:  # the version's other files (config, tokenizer) stay in it
        files += [f.with_content_id() for f in parent_tree.files if not f.path.startswith(dcp_tree.PREFIX)]
    tree = Tree(tuple(sorted(files, key=lambda f: f.path)), chunk_bytes)
    stored = writer.stored_bytes + sum(r[0].storage_data.stored_bytes for r in results if r)
    meta = {**w.metadata, "dcp": {"world_size": len(results), "items": len(metadata.state_dict_metadata)}}
    new = Commit(tree.id, (parent,) if parent else (), w.author or default_author(), int(time.time()), w.message, meta)
    packs = [(rank[0].storage_data.pack, rank[0].storage_data.rows) for rank in results if rank] + [(pack, rows)]
    repo.record_commit(new, tree, stored, packs=packs, branch=branch, expected=parent,  # CAS; HEAD's: the files follow
                       reason=f"dcp save: {new.summary}")
    return new.id, stored


# -- loading ---------------------------------------------------------------------------------------
class WvcStorageReader(StorageReader):
    """``trust_pickles``: DCP's planner unpickles BytesIO items in torch's unrestricted mode
    (arbitrary code, from a remote). By default each such item is first loaded in torch's
    weights-only mode and refused if that fails, so only plain data reaches DCP."""

    def __init__(self, repo_path_or_url, rev: str = "HEAD", *, trust_pickles: bool = False):
        super().__init__()
        self.source = str(repo_path_or_url)
        self.rev = rev
        self.trust_pickles = trust_pickles
        self._view = None
        self._layout: dcp_tree.DcpManifest | None = None
        self.storage_data: dict = {}
        self._repo = None  # a local source: its store decodes ahead on its pool

    @property
    def view(self):
        """The version being loaded (a VersionView of the repository or remote)."""
        if self._view is None:
            from ..read.view import open_version

            self._view = open_version(self.source, self.rev)
            if dcp_tree.METADATA_PATH not in self._view.tree.by_path():
                raise FormatError(f"{self.source} {self.rev}: not a DCP commit (no {dcp_tree.METADATA_PATH})")
        return self._view

    @property
    def downloaded_bytes(self) -> int:
        """Bytes this reader fetched from a remote (0 for a local repository)."""
        source = getattr(self.view, "_get", None)
        remote = getattr(source, "remote", None)
        return remote.bytes_downloaded if remote is not None else 0

    def layout(self) -> dcp_tree.DcpManifest:
        """The save's layout (which rank file holds each shard), validated against the tree."""
        if self._layout is None:
            self._layout = dcp_tree.DcpManifest.from_bytes(self.view.read_file(dcp_tree.METADATA_PATH))
            files = self.view.tree.by_path()
            for fqn, item in self._layout.tensors.items():
                for s in item.shards:
                    entry = files.get(s.file)
                    t = next((t for t in entry.tensors if t.name == s.tensor), None) if entry else None
                    if t is None or t.dtype != item.dtype or tuple(t.shape) != s.sizes:
                        raise FormatError(f"{dcp_tree.METADATA_PATH}: shard {s.tensor!r} of {fqn!r} does "
                                          "not match the tree")
            for fqn, path in self._layout.blobs.items():
                if path not in files:
                    raise FormatError(f"{dcp_tree.METADATA_PATH}: {fqn!r} names a missing file")
        return self._layout

    def reset(self, checkpoint_id=None) -> None:
        pass

    def read_metadata(self, *args, **kwargs) -> Metadata:
        layout = self.layout()
        state, storage = {}, {}
        for fqn, item in layout.tensors.items():
            dtype = getattr(torch, DTYPES[item.dtype].torch_name)
            chunks = [ChunkStorageMetadata(torch.Size(s.offsets), torch.Size(s.sizes)) for s in item.shards]
            state[fqn] = TensorStorageMetadata(TensorProperties(dtype=dtype, requires_grad=item.requires_grad),
                                               torch.Size(item.size), chunks)
            for s in item.shards:
                storage[MetadataIndex(fqn, torch.Size(s.offsets))] = s
        for fqn, path in layout.blobs.items():
            state[fqn] = BytesStorageMetadata()
            storage[MetadataIndex(fqn)] = path
        return Metadata(state_dict_metadata=state, storage_data=storage)

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args, **kwargs) -> None:
        self.storage_data = metadata.storage_data

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner) -> Future:
        """Every request of this rank: bytes items, then tensor regions. The chunks of all
        contiguous regions are decoded in one pipelined pass (the store's decode pool
        for a local repository) and copied straight into their targets."""
        files = self.view.tree.by_path()
        placed = []  # (request, target, flat target bytes, [(chunk id, src begin, src end, dst offset)])
        for req in plan.items:
            ref = self.storage_data[req.storage_index]
            if req.type == LoadItemType.BYTE_IO:
                data = self.view.read_file(ref)
                if not self.trust_pickles:
                    _check_plain(data, req.storage_index.fqn)
                planner.load_bytes(req, io.BytesIO(data))
                continue
            entry = next(t for t in files[ref.file].tensors if t.name == ref.tensor)
            target = planner.resolve_tensor(req).detach()
            if tuple(target.size()) != tuple(req.lengths):
                raise FormatError(f"{ref.tensor}: a read of {tuple(req.lengths)} for a target of {tuple(target.size())}")
            pieces = _pieces(entry, ref, req, self.view.tree.chunk_bytes)
            if pieces is None or not target.is_contiguous() or target.device.type != "cpu":
                target.copy_(_read_whole_region(self.view, entry, req))  # a region not contiguous in its shard
                planner.commit_tensor(req, target)
                continue
            placed.append((req, target, target.reshape(-1).view(torch.uint8).numpy(), pieces))
        chunk_ids = [cid for *_, pieces in placed for cid, *_ in pieces]
        blocks = iter(self._get_many(chunk_ids))
        import numpy as np

        for req, target, flat, pieces in placed:
            for _, begin, end, at in pieces:
                flat[at: at + end - begin] = np.frombuffer(next(blocks), dtype=np.uint8)[begin:end]
            planner.commit_tensor(req, target)
        fut: Future = Future()
        fut.set_result(None)
        return fut

    def _get_many(self, chunk_ids):
        if local_repository(self.source) is not None:
            if self._repo is None:
                self._repo = Repo.open(self.source)
            return self._repo.read_chunks(chunk_ids)  # decoded ahead on the pool
        return self.view.get_many(chunk_ids)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        return False


def _check_plain(data: bytes, fqn: str) -> None:
    try:
        torch.load(io.BytesIO(data), weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any failure means: not plain data
        raise FormatError(f"DCP item {fqn!r} holds more than plain data ({type(exc).__name__}); "
                          "load it with WvcStorageReader(..., trust_pickles=True) only if you trust its source") from exc


def _pieces(entry, shard: dcp_tree.Shard, req, chunk_bytes: int):
    """For a request contiguous in its saved shard: [(chunk id, begin, end, offset in the
    target)] of the bytes to copy, only the chunks under the region; None otherwise."""
    width = DTYPES[entry.dtype].width
    span = dcp_tree.contiguous_rows(shard.sizes, tuple(req.storage_offsets), tuple(req.lengths))
    if span is None:
        return None
    begin, end = span[0] * width, span[1] * width
    out = []
    for (b, e), cid in zip(tensor_spans(entry, chunk_bytes), entry.chunks):
        if e <= begin or b >= end:
            continue
        lo, hi = max(begin, b), min(end, e)
        out.append((cid, lo - b, hi - b, lo - begin))
    return out


def _read_whole_region(view, entry, req):
    from ..read.tensors import tensor_from_chunks

    part = tensor_from_chunks(view, entry, "cpu")
    for dim, (offset, length) in enumerate(zip(req.storage_offsets, req.lengths)):
        part = part.narrow(dim, offset, length)
    return part
