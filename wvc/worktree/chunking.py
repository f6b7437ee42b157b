"""Chunking: turn a working tree (or an in-memory state dict) into a Tree of chunks.

Streaming: one chunk is in memory at a time (plus its base), whatever the model size.
Each tensor chunk is offered to the store with the id of the same chunk of the same
tensor in the parent tree as its delta base. A file whose cached content id equals the
parent's is not read at all: its entry is reused. A file's id comes from its chunk list
(FileEntry.content_id), so each byte is hashed once, for its chunk's id.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConcurrentUpdate, InvalidArgument, SafetensorsFormatError, UnsupportedTensor
from ..formats import safetensors as st
from ..formats.dtypes import BYTES, DTYPES, by_torch_dtype
from ..model.chunk_spans import chunk_spans
from ..model.versions import FileEntry, TensorEntry, Tree
from ..progress import Progress
from ..store.chunk_writer import ChunkWriter
from .scan import StatCache, is_executable

STATE_DICT_PATH = "model.safetensors"


class TensorStream:
    """A commit's source that is a stream of ``(name, tensor)`` pairs, one at a time (a
    trainer's gathered parameters, e.g. TRL's weight-sync iterator), taking the place of the
    same-named tensors of the parent version's safetensors files. Each tensor is encoded as it
    arrives and let go: no second copy of the model is ever held. ``device``: where the
    tensors are (picks the commit's encoder like a state dict's location does)."""

    def __init__(self, pairs, device: str = "cpu"):
        self.pairs = pairs
        self.location = "device" if str(device).startswith("cuda") else "host"


@dataclass
class ParentIndex:
    """Finds the parent chunk to delta against: same path and tensor, else same tensor name."""

    by_path: dict[str, FileEntry] = field(default_factory=dict)
    by_tensor: dict[str, TensorEntry] = field(default_factory=dict)
    by_path_tensor: dict[tuple[str, str], TensorEntry] = field(default_factory=dict)

    @classmethod
    def of(cls, tree: Tree | None) -> "ParentIndex":
        index = cls()
        if tree is not None:
            index.by_path = tree.by_path()
            for f in tree.files:
                for t in f.tensors:
                    index.by_tensor.setdefault(t.name, t)
                    index.by_path_tensor.setdefault((f.path, t.name), t)
        return index

    def tensor(self, path: str, name: str) -> TensorEntry | None:
        found = self.by_path_tensor.get((path, name))
        return found if found is not None else self.by_tensor.get(name)


def _base(chunks: tuple[str, ...] | None, i: int) -> str | None:
    return chunks[i] if chunks and i < len(chunks) else None


class TreeBuilder:
    def __init__(self, writer: ChunkWriter, parent: Tree | None, chunk_bytes: int, progress: Progress,
                 located=None, tee=None):
        """``located(chunk id, (path, offset), length)``, if given, hears where each chunk read
        from a file lies in it (a base model's index records that instead of storing chunks).
        ``tee(path, executable)``, if given, gives a sink for each file read from a directory
        (``write(bytes)``, ``finish(entry)``, ``abort()``) that gets the file's bytes as they
        are hashed: the very bytes the entry names (worktree/refresh.SourceCopies)."""
        self.writer = writer
        self.parent = ParentIndex.of(parent)
        self.chunk_bytes = chunk_bytes
        self.progress = progress
        self.located = located
        self.tee = tee

    def _put(self, raw, dtype, base: str | None, origin: tuple[str, int] | None) -> str:
        object_id = self.writer.put(raw, dtype, base)
        if origin is not None and self.located is not None:
            self.located(object_id, origin, len(raw))
        return object_id

    # -- working tree --------------------------------------------------------------------
    def directory(self, root: Path, paths: list[str], stat_cache: StatCache) -> Tree:
        for path in paths:  # validate every header before writing anything
            if path.endswith(".safetensors"):
                with open(root / path, "rb") as fh:
                    st.read_header(fh, os.fstat(fh.fileno()).st_size, path)
        self.progress.start(sum(os.stat(root / p).st_size for p in paths), "commit")
        files = []
        for path in paths:
            full = root / path
            before = os.stat(full)
            parent_entry = self.parent.by_path.get(path)
            cached = stat_cache.cached_hash(path, before, self.chunk_bytes)
            if parent_entry is not None and cached == parent_entry.content_id:
                files.append(parent_entry.with_content_id())
                self.progress.advance(before.st_size)
                continue
            with open(full, "rb") as fh:
                # Header and data come from this one open file, and its signature is checked
                # against the path's after reading: a file replaced at any point is refused,
                # never stored as one version's header over another's data.
                opened = os.fstat(fh.fileno())
                executable = is_executable(opened)
                sink = self.tee(path, executable) if self.tee is not None else None
                try:
                    if path.endswith(".safetensors"):
                        header = st.read_header(fh, opened.st_size, path)
                        entry = self._safetensors_file(path, fh, header, executable, sink)
                    else:
                        entry = self._blob_file(path, fh, opened.st_size, executable, sink)
                    after = os.stat(full)
                    if StatCache.signature(after) != StatCache.signature(opened) or entry.size != after.st_size:
                        raise ConcurrentUpdate(f"{path} changed while it was being committed; commit again when it "
                                               "is written")
                except BaseException:
                    if sink is not None:
                        sink.abort()
                    raise
                if sink is not None:
                    sink.finish(entry)
            stat_cache.remember(path, after, self.chunk_bytes, entry.hash)
            files.append(entry)
        self.progress.close()
        return Tree(tuple(files), self.chunk_bytes)

    def _blob_file(self, path: str, fh, size: int, executable: bool = False, sink=None) -> FileEntry:
        parent = self.parent.by_path.get(path)
        parent_chunks = parent.chunks if parent is not None and parent.kind == "blob" else None
        if parent_chunks:
            self.writer.expect_bases(parent_chunks)
        chunks = []
        for i, (begin, end) in enumerate(chunk_spans(size, 1, self.chunk_bytes)):
            raw = fh.read(end - begin)
            if len(raw) != end - begin:
                raise ConcurrentUpdate(f"{path} was truncated while it was being committed")
            if sink is not None:
                sink.write(raw)
            chunks.append(self._put(raw, BYTES, _base(parent_chunks, i), (path, begin)))
            self.progress.advance(len(raw))
        return FileEntry.of(path, "blob", size, chunks=tuple(chunks), executable=executable)

    def _safetensors_file(self, path: str, fh, header: st.SafetensorsHeader, executable: bool = False,
                          sink=None) -> FileEntry:
        parent = self.parent.by_path.get(path)
        if parent is not None:
            self.writer.expect_bases(parent.chunk_ids())  # the delta bases of this file, looked up at once
        header_id = self._put(header.header_bytes, BYTES, parent.header if parent and parent.header else None,
                              (path, 8))
        self.progress.advance(header.data_start)
        if sink is not None:  # (the file as materialize writes it: the length, the header, the tensors)
            sink.write(len(header.header_bytes).to_bytes(8, "little"))
            sink.write(header.header_bytes)
        fh.seek(header.data_start)
        tensors = []
        for info in header.tensors:
            def read(n, info=info):
                raw = fh.read(n)
                if len(raw) != n:
                    raise SafetensorsFormatError(f"{path}: truncated inside tensor {info.name!r}")
                if sink is not None:
                    sink.write(raw)
                return raw

            tensors.append(self._tensor(path, info.name, info.dtype, info.shape, info.nbytes, read,
                                        header.data_start + info.begin))
        return FileEntry.of(path, "safetensors", header.file_size, header=header_id, tensors=tuple(tensors),
                            executable=executable)

    def _tensor(self, path, name, dtype, shape, nbytes, read, start: int | None = None) -> TensorEntry:
        """One tensor's chunks; ``start`` is its offset in the file (None: from memory)."""
        parent = self.parent.tensor(path, name)
        parent_chunks = parent.chunks if parent is not None and parent.dtype == dtype.name else None
        chunks = []
        for i, (begin, end) in enumerate(chunk_spans(nbytes, dtype.width, self.chunk_bytes)):
            raw = read(end - begin)
            origin = (path, start + begin) if start is not None else None
            chunks.append(self._put(raw, dtype, _base(parent_chunks, i), origin))
            self.progress.advance(len(raw))
        return TensorEntry(name, dtype.name, tuple(shape), tuple(chunks))

    # -- state dict ----------------------------------------------------------------------
    def state_dict_file(self, state_dict, path: str = STATE_DICT_PATH, metadata: dict | None = None) -> FileEntry:
        """The entry ``safetensors.torch.save_file(state_dict, path, metadata)`` would give.

        Tensors are read straight from memory (moved to the CPU one chunk at a time for
        hashing); no file is written.
        """
        import torch

        specs, tensors = [], {}
        for name, tensor in state_dict.items():
            if not isinstance(tensor, torch.Tensor):
                raise UnsupportedTensor(f"state dict entry {name!r} is not a tensor")
            specs.append((name, by_torch_dtype(tensor.dtype), tuple(tensor.shape)))
            tensors[name] = tensor.detach()
        header_bytes, layout = st.build_header(specs, metadata)
        header = st.parse_header(header_bytes, layout[-1].end if layout else 0, path)
        parent = self.parent.by_path.get(path)
        if parent is not None:
            self.writer.expect_bases(parent.chunk_ids())
        header_id = self.writer.put(header_bytes, BYTES, parent.header if parent and parent.header else None)
        self.progress.start(header.file_size, "commit")
        if self.writer.device != "cpu":
            entries = self._device_tensors(path, header.tensors, tensors)
            self.progress.close()
            return FileEntry.of(path, "safetensors", header.file_size, header=header_id, tensors=tuple(entries))
        entries = []
        for info in header.tensors:
            flat = tensors[info.name].contiguous().reshape(-1).view(torch.uint8)
            entries.append(self._tensor(path, info.name, info.dtype, info.shape, info.nbytes, _reader(flat)))
        self.progress.close()
        return FileEntry.of(path, "safetensors", header.file_size, header=header_id, tensors=tuple(entries))

    def tensor_stream(self, stream: TensorStream) -> tuple[FileEntry, ...]:
        """The parent version's files with each streamed tensor in place of its namesake: its
        file, shape and dtype are the parent's (the checkpoint layout: shards, header and
        metadata unchanged), each tensor cast to that dtype (a bf16 checkpoint of fp32
        training, cast as ``save_pretrained`` in bf16 would). A tensor the stream leaves out
        (a frozen one) keeps its entry; a name the parent does not hold, or a shape it holds
        otherwise, is an error before anything is recorded (the writer's pack is dropped)."""
        import torch

        where = {}  # tensor name -> (file path, its entry)
        for f in self.parent.by_path.values():
            if f.kind == "safetensors":
                self.writer.expect_bases(f.chunk_ids())  # the delta bases, looked up at once
                for t in f.tensors:
                    where.setdefault(t.name, (f.path, t))
        replaced: dict[str, dict[str, TensorEntry]] = {}
        self.progress.start(sum(t.nbytes for _, t in where.values()), "commit")
        for name, tensor in stream.pairs:
            if name not in where:
                raise InvalidArgument(f"streamed tensor {name!r} is in no safetensors file of the parent version")
            path, old = where[name]
            if name in replaced.get(path, {}):
                raise InvalidArgument(f"streamed tensor {name!r} came twice")
            if tuple(tensor.shape) != tuple(old.shape):
                raise InvalidArgument(f"streamed tensor {name!r} has shape {tuple(tensor.shape)}, the parent's "
                                      f"{tuple(old.shape)}")
            dtype = DTYPES[old.dtype]
            flat = tensor.detach().to(getattr(torch, dtype.torch_name)).contiguous().reshape(-1).view(torch.uint8)
            if self.writer.device != "cpu":
                (entry,) = self._device_tensors(path, [_Spec(name, dtype, tuple(old.shape), old.nbytes)],
                                                {name: flat})
            else:
                entry = self._tensor(path, name, dtype, old.shape, old.nbytes, _reader(flat))
            replaced.setdefault(path, {})[name] = entry
            del flat, tensor  # (the stream's own reference goes when it advances)
        self.progress.close()
        files = []
        for f in self.parent.by_path.values():
            new = replaced.get(f.path)
            if not new:
                files.append(f.with_content_id())
                continue
            tensors = tuple(new.get(t.name, t) for t in f.tensors)
            files.append(FileEntry.of(f.path, f.kind, f.size, header=f.header, tensors=tensors,
                                      executable=f.executable))
        return tuple(sorted(files, key=lambda f: f.path))

    def _device_tensors(self, path: str, infos, tensors: dict) -> list[TensorEntry]:
        """The tensors' chunks, batched for the device path (``writer.device`` a torch device):
        chunks of several tensors travel and are transformed together, BATCH_BYTES at a time,
        and the next batch's copy to the host (its bytes are hashed there) is started before
        this batch is encoded, so copies, device work and host work overlap. Tensors already
        on the host are hashed where they are and copied up instead."""
        import torch

        from ..codec.device_copy import DeviceCopies

        device = "cpu" if self.writer.device == "torch-cpu" else self.writer.device
        copies = DeviceCopies(device)
        plan = []  # (tensor index, the chunk's bytes as a uint8 tensor, dtype, base id)
        for k, info in enumerate(infos):
            flat = tensors[info.name].contiguous().reshape(-1).view(torch.uint8)
            if flat.device.type != "cpu" and flat.device != copies.device:  # another GPU's: over to ours
                flat = flat.to(copies.device)
            parent = self.parent.tensor(path, info.name)
            parent_chunks = parent.chunks if parent is not None and parent.dtype == info.dtype.name else None
            for i, (begin, end) in enumerate(chunk_spans(info.nbytes, info.dtype.width, self.chunk_bytes)):
                plan.append((k, flat[begin:end], info.dtype, _base(parent_chunks, i)))
        batches, batch, size = [], [], 0
        for item in plan:
            if batch and size + item[1].numel() > copies.batch_bytes:
                batches.append(batch)
                batch, size = [], 0
            batch.append(item)
            size += item[1].numel()
        if batch:
            batches.append(batch)

        def start(batch):
            """Start the batch's copies: device chunks down (to hash them), host chunks up."""
            down = [x for _, x, _, _ in batch if x.device == copies.device and x.device.type != "cpu"]
            wait = copies.gather_to_host(down) if down else list
            up = [x for _, x, _, _ in batch if x.device != copies.device]
            uploaded = iter(copies.to_device([x.numpy() for x in up]) if up else ())
            return wait, [next(uploaded) if x.device != copies.device else x for _, x, _, _ in batch]

        chunks: list[list[str]] = [[] for _ in infos]
        ahead = start(batches[0]) if batches else None
        for n, batch in enumerate(batches):
            wait, on_device = ahead
            fetched = iter(wait())
            host = [next(fetched) if x.device.type != "cpu" else x.numpy() for _, x, _, _ in batch]
            if n + 1 < len(batches):  # the next batch's copies run while this one is encoded
                ahead = start(batches[n + 1])
            got = self.writer.put_device_batch(
                [(h, x, dtype, base) for h, x, (_, _, dtype, base) in zip(host, on_device, batch)], copies)
            for (k, *_), object_id in zip(batch, got):
                chunks[k].append(object_id)
            self.progress.advance(sum(len(h) for h in host))
        return [TensorEntry(info.name, info.dtype.name, tuple(info.shape), tuple(chunks[k]))
                for k, info in enumerate(infos)]


def _reader(flat):
    """``read(n)`` over a tensor's bytes (a flat uint8 tensor, on any device): the next ``n``,
    moved to the host one chunk at a time."""
    cursor = 0

    def read(n):
        nonlocal cursor
        part = flat[cursor : cursor + n].cpu().numpy()
        cursor += n
        return part

    return read


@dataclass(frozen=True)
class _Spec:
    """What ``_device_tensors`` reads of a header's tensor info."""

    name: str
    dtype: object
    shape: tuple
    nbytes: int
