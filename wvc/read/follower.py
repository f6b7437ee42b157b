"""``wvc.follow``: keep a dict of tensors at the tip of a branch, applying only what changed.

    follower = wvc.follow("hf://team/policy", "main", state_dict=model.state_dict())
    while True:
        update = follower.update(timeout=30)        # None: nothing new within 30 s
        if update:
            model.load_weights([(n, follower.state_dict[n]) for n in update.changed])  # vLLM-style

An update reads the branch's tip, compares its tensors' chunk lists with the ones the
tensors hold, and fetches only the chunks that differ (range reads from a remote, each
decoded and checked against its id). A changed chunk stored as a delta against the chunk
the follower already holds, or against a keyframe it kept, is decoded from those bytes:
nothing else is downloaded (docs/codec.md, "Anchor policy"; docs/training.md). Every new
chunk is fetched and verified before any tensor is touched, then all are written: a
failure (network, corrupt payload) leaves every tensor at the old version, and a retry
completes the move.
"""

from __future__ import annotations

import logging
import time
import warnings
from dataclasses import dataclass, field
from itertools import zip_longest
from pathlib import Path

from .. import ids
from ..model import tree_diff
from ..codec import pool as codec_pool
from ..codec.devices import resolve_device
from ..errors import CorruptObject, InvalidArgument, MissingObject, RemoteNotFound, RevisionNotFound, WvcError
from ..formats.dtypes import DTYPES
from ..model.chunk_spans import tensor_spans
from .cache import cache_root
from .lent_chunks import LentChunks
from ..remotes import open_backend, step_records
from ..remotes.urls import local_repository
from ..remotes.repository import read_branch_tip
from .view import VersionView, open_remote_version, open_version

log = logging.getLogger(__name__)

POLL_SECONDS = (0.5, 5.0)  # first and longest wait between polls of update(timeout=...)
RECORD_GAP = 4 << 10  # bytes a step record's range reads read through rather than open another request
KEYFRAME_BUDGET = 2  # kept keyframes on disk: at most this many times the weights' bytes


@dataclass
class Update:
    commit: str
    parent: str | None  # the commit the tensors held before
    changed: list[str] = field(default_factory=list)  # tensor names whose values changed
    downloaded_bytes: int = 0
    seconds: float = 0.0
    # with follow(..., patches=True): tensor name -> the flat indices (int64) of the elements
    # that changed, or None where the tensor is new (or reshaped): all of it changed. The new
    # values are ``state_dict[name].reshape(-1)[indices]`` (what vLLM's patch loader takes).
    patches: dict | None = None

    def to_json(self):
        out = {k: v for k, v in self.__dict__.items() if k != "patches"}
        if self.patches is not None:
            out["changed_elements"] = {n: None if i is None else int(i.numel()) for n, i in self.patches.items()}
        return out


class _Keyframes:
    """Keyframes the follower has decoded, kept on disk (``$WVC_CACHE/follow/<source>/
    keyframes``): when the publisher re-anchors a chain (a delta against the chain's
    keyframe instead of the step before), the follower downloads that delta only, not the
    keyframe again. At most KEYFRAME_BUDGET times the weights on disk, the least recently
    used dropped first; checked against its id on read."""

    def __init__(self, root: Path):
        self.root = root

    def prune(self, limit_bytes: int) -> int:
        """Drop the least recently used keyframes beyond ``limit_bytes``; returns how many.
        A dropped keyframe that is needed again is fetched again (nothing is lost); without
        a bound, keyframes re-written over a long run would pile up."""
        if not self.root.is_dir():
            return 0
        files = []
        for p in self.root.iterdir():
            try:
                st = p.stat()
            except FileNotFoundError:
                continue
            files.append((st.st_mtime_ns, st.st_size, p))
        total = sum(size for _, size, _ in files)
        dropped = 0
        for _, size, p in sorted(files):
            if total <= limit_bytes:
                break
            p.unlink(missing_ok=True)
            total -= size
            dropped += 1
        return dropped

    def __contains__(self, oid) -> bool:
        return ids.is_object_id(oid) and (self.root / oid).is_file()

    def __getitem__(self, oid) -> bytes:
        path = self.root / oid
        data = path.read_bytes()
        if ids.chunk_id(data) != oid:
            path.unlink(missing_ok=True)  # the next update fetches it from the source again
            raise CorruptObject(f"the follower's kept keyframe {ids.short(oid)} is damaged; retry the update")
        path.touch()  # in use: the last to be pruned
        return data

    def put(self, oid: str, raw: bytes) -> None:
        from ..fsutil import atomic_write

        if oid in self:
            (self.root / oid).touch()  # still in use: the last to be pruned
        else:
            self.root.mkdir(parents=True, exist_ok=True)
            atomic_write(self.root / oid, raw, durable=False)  # a cache, checked on read


class _Held:
    """The chunk bytes the follower holds, by chunk id (delta bases for free): its tensors'
    current chunks, and the keyframes it kept."""

    def __init__(self, follower: "Follower", *, lent: bool = False):
        """``lent``: also a local clone's chunks (Follower's repository=), for a step record's
        decode only: a damaged clone then fails the record, and the ordinary read that
        follows downloads what it would have lent."""
        self.follower = follower
        self.where = {cid: (name, i) for name, e in follower._entries.items() for i, cid in enumerate(e.chunks)}
        self.keyframes = follower._keyframes
        self.lent = follower._lent if lent else None

    def __contains__(self, oid) -> bool:
        return oid in self.where or oid in self.follower._previous or oid in self.keyframes \
            or (self.lent is not None and oid in self.lent)

    def step_context(self, context, base) -> "_OldBytes | None":
        """What the last update kept of the chunk ``context`` it replaced, where that is the
        elements it changed and their old values and its region now holds ``base``: a step
        payload over ``base`` in the context ``context`` then decodes from the region and those
        elements alone (codec.decode_step_changes)."""
        kept = self.follower._previous.get(context) if context is not None and base is not None else None
        if isinstance(kept, _OldBytes) and kept.copy is None and kept.written == base:
            return kept
        return None

    def _place(self, oid):
        """The held chunk ``oid``'s bytes in its tensor (a uint8 view, no copy) and that
        tensor's TensorEntry."""
        name, i = self.where[oid]
        entry = self.follower._entries[name]
        begin, end = tensor_spans(entry, self.follower._chunk_bytes)[i]
        return self.follower.state_dict[name].detach().reshape(-1).view(_uint8())[begin:end], entry

    def region(self, oid):
        """Where the chunk ``oid`` lies in a host tensor the follower writes in place, and the
        tensor's element width; None for one it does not hold there (a device tensor's, a kept
        one, none)."""
        if oid not in self.where or _mirrored(self.follower.state_dict[self.where[oid][0]]):
            return None
        region, entry = self._place(oid)
        return (region, DTYPES[entry.dtype].width) if _written_from_host(region) else None

    def __getitem__(self, oid) -> bytes:
        if oid not in self.where:
            previous = self.follower._previous.get(oid)
            if previous is not None:
                return previous if isinstance(previous, bytes) else previous.bytes()
            if self.lent is not None and oid not in self.keyframes:
                return self.lent[oid]  # (a chunk it no longer lends: MissingObject, the record unused)
            return self.keyframes[oid]
        mirrored = self.follower._mirror.get(oid)
        if mirrored is not None:  # a device tensor's chunk: its host copy, no copy back
            return mirrored
        return self._place(oid)[0].cpu().numpy().tobytes()


class _RecordChunks:
    """The chunks a step record gives (remotes/step_records.py): each decoded against the chunk the
    follower holds at its place (and the step context it kept), from the record's own bytes
    or a range of a pack, and checked against its id. Anything else is missing: the caller
    then falls back to the ordinary read."""

    # Its chunks decode side by side on the codec pool (_move): each reads only the record, the
    # payloads prefetched and the bytes held, none of which changes before the apply. One
    # after another, a CPU engine's update was its decode's time at one core.
    thread_safe = True

    def __init__(self, record, remote, held: _Held):
        self.record, self.remote, self.held = record, remote, held
        self.chunks = {c.id: c for c in record.chunks}
        self.payloads: dict[str, bytes] = {}

    def prefetch(self, object_ids) -> None:
        from ..remotes.downloads import read_payloads
        from ..store.packs import PackEntry

        wanted, carried = {}, {}
        area = self.record.data_path()  # (a large record: its own payloads are read as needed too)
        for oid in object_ids:
            c = self.chunks.get(oid)
            if c is not None and c.pack is not None:
                wanted[oid] = (c.pack, PackEntry(c.id, c.offset, c.length, c.raw_size, 0, c.base))
            elif c is not None and area is not None:
                carried[oid] = (area[0], PackEntry(c.id, area[1] + c.offset, c.length, c.raw_size, 0, c.base))
        # a record names a few scattered payloads of a pack (the rest it carries): read through
        # small gaps only (the default 256 KB gap read 4x the step at a re-anchor)
        for entry, payload in read_payloads(self.remote, wanted, gap=RECORD_GAP):
            self.payloads[entry.id] = payload
        for entry, payload in read_payloads(self.remote, carried, gap=RECORD_GAP, file_of=lambda handle: handle):
            self.payloads[entry.id] = payload

    def payload_bytes(self, oid: str) -> int:
        """What reading ``oid``'s payload brings into memory (for batching the reads)."""
        c = self.chunks.get(oid)
        return c.length if c is not None else 0

    def __call__(self, oid: str) -> bytes:
        from ..store.chains import decode_sparse_verified, decode_step_verified, decode_verified

        c = self.chunks.get(oid)
        if c is None:
            if oid in self.held:
                return self.held[oid]
            raise MissingObject(f"step record of {ids.short(self.record.commit)} lacks chunk {ids.short(oid)}")
        if (c.base is not None and c.base not in self.held) or (c.context is not None and c.context not in self.held):
            raise MissingObject(f"the follower does not hold the base of chunk {ids.short(oid)}")
        payload = self.payloads.pop(oid, None)
        if payload is None:
            payload = self.record.payload(c) if c.pack is None else step_records.stored_payload(self.remote, c)
        where = f"step record of {ids.short(self.record.commit)}"
        kept = self.held.step_context(c.context, c.base)
        if kept is not None:  # decoded over the held bytes, in the context kept: no copy of either
            got = decode_step_verified(oid, payload, c.raw_size, kept.region.numpy(), kept.positions.numpy(),
                                       kept.values.numpy(), where, kept.values.element_size())
            if got is not None:  # (the chunk's bytes are dropped here: its changes are what is written)
                kind = kept.values.dtype
                return _ChunkChanges(len(got[0]), c.base, _host_view(got[1]).view(kept.positions.dtype),
                                     _host_view(got[2]).view(kind), _host_view(got[3]).view(kind), kept.region)
        held = self.held.region(c.base) if kept is None and c.base is not None and c.context is None else None
        if held is not None:  # a SPARSE payload lists its changes: decoded over the held bytes, none compared
            region, width = held
            got = decode_sparse_verified(oid, payload, c.raw_size, region.numpy(), width, where)
            if got is not None:
                kind = _int_kind(width)
                return _ChunkChanges(len(got[0]), c.base, _host_view(got[1]).view(_int_kind(4)),
                                     _host_view(got[2]).view(kind), _host_view(got[3]).view(kind), region)
        context = None if c.context is None else (lambda: self.held[c.context])
        base = None if c.base is None else self.held[c.base]
        return decode_verified(oid, payload, c.raw_size, base, where, context=context)


PREFETCH_BYTES = 64 << 20  # payloads read ahead of their decoding, at most (one larger payload alone)
PREFETCH_CHUNKS = 4096  # (where a source does not say a payload's size)


def _batches(items: list, payload_bytes) -> list[list]:
    """``items`` (name, index, chunk id) in batches of at most PREFETCH_BYTES of payloads
    (``payload_bytes(id)``, when the source knows it) or PREFETCH_CHUNKS chunks."""
    out, batch, held = [], [], 0
    for item in items:
        size = payload_bytes(item[2]) if payload_bytes is not None else 0
        if batch and (held + size > PREFETCH_BYTES or len(batch) >= PREFETCH_CHUNKS):
            out.append(batch)
            batch, held = [], 0
        batch.append(item)
        held += size
    if batch:
        out.append(batch)
    return out


def _tensor_entries(tree) -> dict:
    """A version's tensors by name (the first file's, where two files name one tensor)."""
    entries: dict = {}
    for f in tree.files:
        for t in f.tensors:
            entries.setdefault(t.name, t)
    return entries


def _staged(places: dict, item, raw):
    """What an update holds of a decoded chunk until its write: where its tensor is written in
    place on the host (``places``: Follower._host_places) and few of its elements changed, those
    elements (_ChunkChanges), else its bytes. ``item``: (tensor name, chunk index, chunk id)."""
    name, i, _ = item
    place = places.get(name)
    if place is None or isinstance(raw, _ChunkChanges) or i >= len(place[0]):
        return raw
    olds, flat, spans, width = place
    region = flat[spans[i][0] : spans[i][1]]
    if len(raw) != region.numel():
        return raw  # (_check_places says what is wrong)
    return _ChunkChanges.of(raw, olds[i], region, width) or raw


def _check_places(entries: dict, staged: dict, chunk_bytes: int) -> None:
    """Every staged chunk decodes to exactly the bytes of its place in its tensor, as every
    other reader checks (a tree may name any stored chunk at any place: a 1-byte chunk at
    place 0 of a float32 tensor filled 4096 bytes with that byte). Before anything is written."""
    for name, pieces in staged.items():
        e = entries[name]
        spans = tensor_spans(e, chunk_bytes)
        if len(spans) != len(e.chunks):
            raise CorruptObject(f"tensor {name}: {len(e.chunks)} chunks where its shape makes {len(spans)}")
        for i, raw in pieces:
            begin, end = spans[i]
            if len(raw) != end - begin:
                raise CorruptObject(f"tensor {name}: chunk {i} ({ids.short(e.chunks[i])}) holds {len(raw)} bytes "
                                    f"where its place holds {end - begin}")


class _ChunkChanges:
    """A decoded, verified chunk staged as the elements where it differs from the bytes held
    at its place (``base``, the chunk there): their int32 positions, old and new elements
    (tensors), not as its bytes. Staged whole, a step's decoded chunks were a second copy of
    the model in a following engine (issue 65). A step payload's decoder gives them
    (store.chains.decode_step_verified), else a comparison right after the decode
    (:meth:`of`); the write and its undo then touch only those elements."""

    __slots__ = ("size", "base", "positions", "old", "new", "base_region")

    def __init__(self, size: int, base: str, positions, old, new, base_region):
        self.size, self.base, self.positions, self.old, self.new = size, base, positions, old, new
        self.base_region = base_region  # where the base's bytes are held (until the write)

    @classmethod
    def of(cls, raw, base: str, region, width: int) -> "_ChunkChanges | None":
        """``raw`` (a decoded chunk) against ``region`` (the host bytes of ``base``, its size),
        or None where too many elements differ for this to be smaller."""
        import torch

        kind = _int_kind(width)
        held, new = region.view(kind), _host_view(raw).view(kind)
        positions = torch.nonzero(held != new).reshape(-1).to(torch.int32)  # (a chunk: < 2^28 elements)
        if positions.numel() > _OldBytes.SPARSE_BELOW * held.numel():
            return None
        return cls(len(raw), base, positions, held[positions], new[positions], region)

    def __len__(self) -> int:
        return self.size

    def whole(self) -> bytes:
        """The chunk's bytes (for a place that does not hold its base: the base's place, before
        anything is written, with the changes applied)."""
        out = self.base_region.clone()
        out.view(self.new.dtype)[self.positions] = self.new
        return out.numpy().tobytes()


@dataclass
class _Changed:
    """The elements of a region a write changes: positions (int32) and their new values."""

    positions: object
    values: object

    def write(self, region) -> None:
        region.view(self.values.dtype)[self.positions] = self.values


def _write_chunk(region, new) -> None:
    """One chunk's bytes into a tensor's region: all of them, or only the changed elements
    (_Changed). A seam the tests interrupt."""
    if isinstance(new, _Changed):
        new.write(region)
    else:
        region.copy_(new)


def _uint8():
    import torch

    return torch.uint8


def _int_kind(width: int):
    """The torch integer dtype of ``width`` bytes: elements compared and scattered as bits."""
    import torch

    return {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[width]


# A chunk of a device tensor in which at most this share of the elements changed goes up as
# a patch: the changed elements' positions and values (vLLM's sparse weight updates; an RL
# step changes ~1%: 20x fewer bytes over the link than the chunk), applied on the device.
PATCH_MAX_CHANGED = 0.1


def _changed_elements(before, after, width: int, first: int):
    """The flat indices (int64, on the host) of the elements of a chunk whose bits changed:
    ``before``/``after`` its bytes (uint8 tensors), ``first`` the index of its first element."""
    import torch

    kind = _int_kind(width)
    return (torch.nonzero(before.view(kind) != after.view(kind)).reshape(-1) + first).cpu()


def _merge_patches(into: dict, more: dict | None) -> None:
    """Several steps applied in one update: the union of their changed elements."""
    import torch

    for name, idx in (more or {}).items():
        if name not in into:
            into[name] = idx
        elif into[name] is not None:
            into[name] = None if idx is None else torch.unique(torch.cat([into[name], idx]))


def _mirrored(tensor) -> bool:
    """Whether a held tensor's chunks are mirrored on the host: device memory's are (a
    seam the tests turn on for host tensors, to run the patch path without a device)."""
    return tensor.device.type != "cpu"


class _OldBytes:
    """What a write into a region replaced, kept for its undo and as the next step's
    context (the version before): the elements that change and their old values where few
    do (an RL step changes ~3% of them: ~10% of a copy's memory for bf16), else a copy of the
    region (a shape's worth of a new version, a keyframe). A whole copy of every replaced
    chunk held a second copy of the model in a following engine (issue 65)."""

    SPARSE_BELOW = 0.25  # past this share changed, a copy (int32 positions and values cost more)

    def __init__(self, region, positions, values, copy):
        self.region, self.positions, self.values, self.copy = region, positions, values, copy
        self.written: str | None = None  # the chunk the region holds after the write (_apply)

    @classmethod
    def of(cls, region, new, width: int) -> "_OldBytes":
        """Before ``new`` is written into ``region``: its bytes (uint8, the region's size and
        device), or a _ChunkChanges, whose changes from the region's bytes the decoder gave
        (then nothing is compared or gathered here)."""
        import torch

        if region.device.type != "cpu":  # (a device tensor's: its host mirror is the context)
            return cls(region, None, None, region.clone())
        kind = _int_kind(width)
        old = region.view(kind)
        if isinstance(new, _ChunkChanges):
            positions, values = new.positions, new.old
        else:  # (a chunk holds at most 2^28 elements)
            positions = torch.nonzero(old != new.view(kind)).reshape(-1).to(torch.int32)
            values = None
        if positions.numel() > cls.SPARSE_BELOW * old.numel():
            return cls(region, None, None, region.clone())
        return cls(region, positions, old[positions] if values is None else values, None)

    def write(self, new):
        """What writing ``new`` (bytes as a uint8 tensor, or a _ChunkChanges) into the region
        changes: only those elements (_Changed) where they are known, else ``new`` whole."""
        if isinstance(new, _ChunkChanges):
            return _Changed(new.positions, new.new)
        if self.copy is not None:
            return new
        return _Changed(self.positions, new.view(self.values.dtype)[self.positions])

    @property
    def nbytes(self) -> int:
        """The host or device memory this holds."""
        if self.copy is not None:
            return self.copy.numel()
        return self.positions.numel() * 4 + self.values.numel() * self.values.element_size()

    def restore(self) -> None:
        """Put the old bytes back into the region (the undo)."""
        if self.copy is not None:
            self.region.copy_(self.copy)
        else:
            self.region.view(self.values.dtype)[self.positions] = self.values

    def bytes(self) -> bytes:
        """The old chunk's bytes, while the region holds the write's new ones."""
        if self.copy is not None:
            return self.copy.cpu().numpy().tobytes()
        old = self.region.clone()
        old.view(self.values.dtype)[self.positions] = self.values
        return old.numpy().tobytes()

    def changed(self, region, width: int, first: int):
        """The flat indices (int64, on the host) of the elements the write changed."""
        if self.copy is not None:
            return _changed_elements(self.copy, region, width, first)
        return self.positions.long() + first


@dataclass
class _Patch:
    positions: bytes  # int64 element indices
    values: bytes  # the new elements there
    width: int


def _patch(before, after, width: int) -> _Patch | None:
    """The elements of ``after`` that differ from ``before`` (host bytes of one chunk, the
    same size), or None when too many did for a patch to pay."""
    import numpy as np

    kind = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[width]
    old, new = np.frombuffer(before, dtype=kind), np.frombuffer(after, dtype=kind)
    if len(old) != len(new):
        return None
    positions = np.flatnonzero(old != new)
    if len(positions) > PATCH_MAX_CHANGED * len(new):
        return None
    return _Patch(positions.astype(np.int64).tobytes(), new[positions].tobytes(), width)


def _written_from_host(region) -> bool:
    """Whether decoded bytes go into ``region`` straight from where they lie (a host
    tensor's), not through a batched upload: a seam the tests turn off, to run the device
    path on the host."""
    return region.device.type == "cpu"


# torch warns (once) that a tensor over read-only bytes must not be written: _host_view's are
# only read. Filtered for this module's calls alone, once (warnings.catch_warnings is not
# thread-safe, and the views are made on the codec pool).
warnings.filterwarnings("ignore", message="The given buffer is not writable", category=UserWarning,
                        module=r"wvc\.read\.follower")


def _host_view(raw):
    """A uint8 tensor over decoded bytes, without a copy (read only: it is copied from)."""
    import torch

    return torch.frombuffer(raw, dtype=torch.uint8) if len(raw) else torch.empty(0, dtype=torch.uint8)


class _Uploads:
    """What each write puts into its region, on the region's device: the writes from the one
    asked for on, up to a batch's bytes, go up in one copy (wvc/codec/device_copy.py); a patch is
    applied to a copy of the region's current bytes."""

    def __init__(self, writes: list):
        self.writes, self.lanes, self.ready = writes, {}, {}

    def __getitem__(self, k: int):
        up = self.writes[k][3]
        if isinstance(up, _ChunkChanges):
            return up  # (its changes alone are written: _OldBytes.write)
        if _written_from_host(self.writes[k][2]) and not isinstance(up, _Patch):
            return _host_view(up)  # (staged into a fresh buffer a batch, it was a fifth of an update)
        if k not in self.ready:
            from ..codec.device_copy import DeviceCopies

            device = self.writes[k][2].device
            if device not in self.lanes:
                self.lanes[device] = DeviceCopies(device)
            lane = self.lanes[device]
            batch, parts, size = [], [], 0
            for j in range(k, len(self.writes)):
                up = self.writes[j][3]
                pieces = [up.positions, up.values] if isinstance(up, _Patch) else [up]
                n = sum(len(p) for p in pieces)
                if self.writes[j][2].device != device or (batch and size + n > lane.batch_bytes):
                    break
                batch.append(j)
                parts += pieces
                size += n
            uploaded = iter(lane.to_device(parts))
            self.ready = {j: (next(uploaded), next(uploaded)) if isinstance(self.writes[j][3], _Patch)
                          else next(uploaded) for j in batch}
        got = self.ready.pop(k)
        if not isinstance(got, tuple):
            return got
        import torch

        region, patch = self.writes[k][2], self.writes[k][3]
        kind = _int_kind(patch.width)
        positions, values = got
        new = region.clone()
        new.view(kind)[positions.view(torch.int64)] = values.view(kind)
        return new


class Follower:
    """Keeps a dict of tensors at the tip of a branch of a repository or remote (``wvc.follow``).

    Each ``update()`` reads only what changed since the version it holds, applies it in place
    (on ``device``, or into the caller's ``state_dict``), checks every chunk's hash, and rolls
    back on any failure: the dict always holds one whole committed version."""

    def __init__(self, source, branch: str = "main", *, state_dict=None, device: str = "cpu", at: str | None = None,
                 patches: bool = False, accept=None, repository=None):
        """``accept(entries)``: raises when a version (its TensorEntry by name) must not be
        taken at all, checked before anything is fetched or allocated (an engine's follower:
        what a fresh engine would refuse). ``at``: the commit whose version ``state_dict``
        already holds (an engine started from that checkout): the first update then reads only what changed since it, not the whole
        version. It is checked, not trusted: every chunk of the state dict is hashed against
        that version's chunk ids before the first update (InvalidArgument if one differs).
        ``patches``: each Update names the changed elements of each changed tensor (their flat
        indices, found while each chunk is written: the old bytes are at hand then, so no copy
        of the state dict is kept to diff against). ``repository``: a local clone of the
        source whose chunks are used where a step or a delta names them, not downloaded
        (read/lent_chunks.py): a server started mid-run from its checkout then reads one step."""
        if at is not None and state_dict is None:
            raise InvalidArgument("at= names the version a given state_dict holds: pass that state_dict too")
        self._at = at
        self._want_patches = patches
        self.source = str(source)
        self.branch = branch
        self._own = state_dict is None
        self._accept = accept
        self.device = resolve_device(device, allow_test_backend=False) if self._own else None
        self.state_dict = {} if state_dict is None else state_dict
        self.commit: str | None = None
        self._entries: dict = {}  # tensor name -> the TensorEntry its values are
        self._tree = None  # the version's tree: a step record's tree diff applies to it
        # chunk id -> each chunk the last update replaced (_OldBytes, or a mirror's host bytes):
        # the version before, which a step payload of the next step is coded in the context of
        # (what the undo kept of them anyway; kept until the next update)
        self._previous: dict = {}
        # chunk id -> host bytes of each chunk of the tensors held in device memory: the
        # bases its deltas decode against without copying them back, and what a patch of
        # only the changed elements is computed from (see _apply); one host copy of them
        self._mirror: dict = {}
        self._chunk_bytes = 0
        self._local = local_repository(self.source) is not None
        # the remote's catalogs are immutable: each is read once, whatever the number of polls
        self._catalogs = cache_root() / "follow" / ids.cache_name(self.source, 24)
        self._keyframes = _Keyframes(self._catalogs / "keyframes")
        self._lent = repository if repository is None or isinstance(repository, LentChunks) else LentChunks(repository)

    def _start_at(self) -> None:
        """Take the version ``at`` names as the one held: its tree (read, no chunk downloaded),
        once the state dict's bytes are checked to be that version's, chunk by chunk."""
        view = self._open(self._at)
        entries = _tensor_entries(view.tree)
        self._check(entries)
        for name, e in entries.items():
            flat = self.state_dict[name].detach().reshape(-1).view(_uint8())
            for i, (cid, (begin, end)) in enumerate(zip(e.chunks, tensor_spans(e, view.tree.chunk_bytes))):
                if ids.chunk_id(flat[begin:end].cpu().numpy().tobytes()) != cid:
                    raise InvalidArgument(
                        f"the state dict does not hold version {ids.short(view.commit)} (at=): its {name} differs "
                        f"from that version's (from chunk {i} of {len(e.chunks)}); name the version they were "
                        f"loaded from, or none (the first update then loads the whole version)")
        self.commit, self._tree, self._entries, self._chunk_bytes = view.commit, view.tree, entries, view.tree.chunk_bytes
        self._at = None

    def _open(self, rev: str) -> VersionView:
        if self._local:
            return open_version(self.source, rev)
        self._catalogs.mkdir(parents=True, exist_ok=True)
        return open_remote_version(self.source, "main" if rev == "HEAD" else rev, self._catalogs,
                                   held=_Held(self), keep_keyframe=self._keyframes.put)

    def _by_records(self, backend, tip: str, t0: float) -> Update | None:
        """Move to ``tip`` by the remote's step records (remotes/step_records.py): one small read a
        step, then the changed chunks' payloads, each a delta against a chunk held; no
        listing, no catalog. None when there is no usable record chain back to the version
        held (the caller then reads the version the ordinary way, from where this left off)."""
        if self._tree is None:
            return None
        records, commit, header_bytes = [], tip, 0
        try:
            while commit != self.commit:
                record = step_records.fetch(backend, commit) if len(records) < step_records.KEEP else None
                if record is None:
                    return None
                header_bytes += record.header_bytes
                if header_bytes > step_records.MAX_HEADER:  # the chain's headers, parsed and held at once
                    return None
                records.append(record)
                commit = record.parent
        except WvcError as exc:
            log.debug("follower: step records unusable (%s); reading the version the usual way", exc)
            return None
        first, changed, patches = self.commit, set(), {} if self._want_patches else None
        for record in reversed(records):
            try:
                tree = self._tree_of(record)
                moved = self._move(VersionView(record.commit, tree, _RecordChunks(record, backend, _Held(self, lent=True))), t0)
            except WvcError as exc:  # (the steps already applied stay: each was a whole version)
                log.debug("follower: step record of %s not applied (%s); reading the version the usual way",
                          record.commit[:12], exc)
                return None
            changed.update(moved.changed)
            if patches is not None:
                _merge_patches(patches, moved.patches)
        return Update(tip, first, sorted(changed), backend.bytes_downloaded, time.perf_counter() - t0, patches)

    def _tree_of(self, record):
        from ..model.versions import Commit, Tree

        commit = Commit.from_bytes(record.commit_bytes, record.commit)  # (parse checked it; the tree id from it)
        if record.tree_bytes is not None:
            return Tree.from_bytes(record.tree_bytes, commit.tree)
        try:
            tree = tree_diff.apply_diff(self._tree, record.tree_diff)
        except ValueError as exc:
            raise CorruptObject(f"step record of {ids.short(record.commit)}: {exc}") from exc
        if tree.id != commit.tree:
            raise CorruptObject(f"step record of {ids.short(record.commit)} does not give its commit's tree")
        return tree

    def update(self, rev: str | None = None, timeout: float | None = None) -> Update | None:
        """Move to the branch tip (or ``rev``); None when already there (after waiting up to
        ``timeout`` seconds for a new commit, polling with back-off)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        wait = POLL_SECONDS[0]
        if self._at is not None:
            self._start_at()
        while True:
            t0 = time.perf_counter()
            try:
                view = None
                named = rev is not None and ids.is_object_id(rev)  # a full commit id (a trainer's)
                if named and rev == self.commit:
                    return None  # that version is what is held
                if (rev is None or named) and not self._local and self.commit is not None:
                    backend = open_backend(self.source)
                    # one small read when nothing is new; a commit named by its id is moved to by
                    # the records too (else an anchor step reads the drift since its anchor)
                    tip = rev if named else read_branch_tip(backend, self.branch)
                    if tip != self.commit:
                        moved = self._by_records(backend, tip, t0) if tip is not None else None
                        if moved is not None:
                            return moved
                        view = self._open(rev or self.branch)
                else:
                    view = self._open(rev or self.branch)
            except (RemoteNotFound, RevisionNotFound):
                # Started before the publisher's first push: with a timeout, wait for it
                # like for any new commit; a single look (no timeout) says what is missing.
                if self.commit is not None or deadline is None:
                    raise
                view = None
            if view is not None and view.commit != self.commit:
                return self._move(view, t0)
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is None or remaining <= 0:
                return None
            # Waits out the timeout even when a poll would not fit in it: returning at once made
            # a loop of short updates poll as fast as it could (a follower of a Hub repo spent
            # the request quota its publisher needed to push).
            time.sleep(min(wait, remaining))
            if wait >= remaining:
                return None
            wait = min(wait * 2, POLL_SECONDS[1])

    def _move(self, view: VersionView, t0: float) -> Update:
        entries = _tensor_entries(view.tree)
        self._check(entries)
        source = view.chunk_source
        remote = getattr(source, "remote", None)
        # 1. fetch and verify every changed chunk; nothing is written yet
        wanted: dict[str, list[tuple[int, str]]] = {}
        for name, e in entries.items():
            old = self._entries.get(name)
            if old is not None and old.chunks == e.chunks:
                continue
            same_layout = old is not None and old.dtype == e.dtype and tuple(old.shape) == tuple(e.shape) \
                and self._chunk_bytes == view.tree.chunk_bytes
            olds = old.chunks if same_layout else ()
            wanted[name] = [(i, cid) for i, (was, cid) in enumerate(zip_longest(olds, e.chunks))
                            if cid is not None and was != cid]
        staged: dict[str, list] = {name: [] for name in wanted}
        places = self._host_places(entries, wanted, view.tree.chunk_bytes)
        # the payloads in a few range requests, not one per chunk; a batch at a time, each
        # decoded before the next is read: what a remote names (a record may name 257 MiB a
        # chunk) is never all in memory at once, only the decoded chunks this update writes
        for batch in _batches([(name, i, cid) for name, pieces in wanted.items() for i, cid in pieces],
                              getattr(source, "payload_bytes", None)):
            if remote is not None:
                source.prefetch(cid for _, _, cid in batch)
            pool = codec_pool.pool()
            if getattr(source, "thread_safe", False):
                decoded = pool.map(lambda item: _staged(places, item, view.get(item[2])), batch)
            else:  # decoded one after another here, each compared on the pool while the next decodes
                decoded = [f.result() for f in [pool.submit(_staged, places, item, view.get(item[2])) for item in batch]]
            for (name, i, _), raw in zip(batch, decoded):
                staged[name].append((i, raw))
        _check_places(entries, staged, view.tree.chunk_bytes)
        # 2. apply, all of it, or none: a failure or an interrupt midway undoes what was written
        self._previous, patches = self._apply(entries, staged, view.tree.chunk_bytes)
        self._keyframes.prune(KEYFRAME_BUDGET * sum(e.nbytes for e in entries.values()))
        parent, self.commit = self.commit, view.commit
        self._entries, self._chunk_bytes, self._tree = entries, view.tree.chunk_bytes, view.tree
        return Update(view.commit, parent, sorted(staged), remote.bytes_downloaded if remote is not None else 0,
                      time.perf_counter() - t0, patches)

    def _host_places(self, entries: dict, wanted, chunk_bytes: int) -> dict:
        """Of the tensors an update changes, those whose chunks are written in place on the host
        (held with the same layout, not mirrored from a device): name -> (the chunk ids held,
        the tensor's bytes, its chunk spans, its element width)."""
        import torch

        places = {}
        for name in wanted:
            e, old, current = entries[name], self._entries.get(name), self.state_dict.get(name)
            if old is None or current is None or self._chunk_bytes != chunk_bytes or old.dtype != e.dtype \
                    or tuple(old.shape) != tuple(e.shape) or _mirrored(current):
                continue
            if tuple(current.shape) != tuple(e.shape) or current.dtype != getattr(torch, DTYPES[e.dtype].torch_name):
                continue  # (the follower's own tensor of another shape: replaced whole, _apply)
            flat = current.detach().reshape(-1).view(torch.uint8)
            if _written_from_host(flat):
                places[name] = (old.chunks, flat, tensor_spans(e, chunk_bytes), DTYPES[e.dtype].width)
        return places

    def _apply(self, entries: dict, staged: dict, chunk_bytes: int) -> tuple[dict, dict | None]:
        """Write the staged chunks. In place, what each write replaces is first kept aside
        (_OldBytes: on the host the changed elements' positions and old values, which are
        also all that is written where under a quarter of the chunk changed; on a device a
        clone, so no copy crosses to the host) until the end: if anything raises midway (an
        interrupt included), every tensor gets its old bytes back before the exception goes on. New
        tensors (the follower's own, or a changed shape) are filled aside and swapped in at
        the end. The new bytes reach each device in one copy per batch of chunks (pinned, on
        the copy stream: wvc/codec/device_copy.py). Returns the replaced chunks' old bytes by id, and
        (with ``patches``) each changed tensor's changed element indices (None: all of it)."""
        import torch

        undo: list[_OldBytes] = []
        previous: dict = {}
        fresh: dict[str, object] = {}
        writes: list[tuple[str, int, object, object]] = []  # (name, chunk index, region, what goes up)
        mirror: dict = {}
        for name, pieces in staged.items():
            e = entries[name]
            dtype = getattr(torch, DTYPES[e.dtype].torch_name)
            current = self.state_dict.get(name)
            if self._own and (current is None or tuple(current.shape) != tuple(e.shape) or current.dtype != dtype):
                current = fresh[name] = torch.empty(tuple(e.shape), dtype=dtype, device=self.device)
            flat = current.detach().reshape(-1).view(torch.uint8)
            spans = tensor_spans(e, chunk_bytes)
            old = self._entries.get(name) if name not in fresh and self._chunk_bytes == chunk_bytes else None
            mirrored = _mirrored(current)
            for i, raw in pieces:
                region = flat[spans[i][0] : spans[i][1]]
                was = old.chunks[i] if old is not None and i < len(old.chunks) else None
                if isinstance(raw, _ChunkChanges) and (raw.base != was or mirrored or not _written_from_host(region)):
                    raw = raw.whole()  # (its changes are from another place's bytes; nothing is written yet)
                before = self._mirror.get(was) if mirrored and was is not None else None
                patch = _patch(before, raw, DTYPES[e.dtype].width) if before is not None else None
                writes.append((name, i, region, patch if patch is not None else raw))
                if mirrored:
                    mirror[e.chunks[i]] = bytes(raw)
        uploads = _Uploads(writes)
        patches: dict | None = {} if self._want_patches else None
        # what each host write replaces, found side by side on the codec pool before any is
        # written (each compares its own region with its new bytes; one after another it was
        # a fifth of a CPU engine's update)
        on_host = [k for k, (name, _, region, up) in enumerate(writes)
                   if name not in fresh and _written_from_host(region) and not isinstance(up, _Patch)]

        def replaced(k: int) -> _OldBytes:
            name, _, region, _ = writes[k]
            return _OldBytes.of(region, uploads[k], DTYPES[entries[name].dtype].width)

        olds = dict(zip(on_host, codec_pool.pool().map(replaced, on_host)))
        try:
            for k, (name, i, region, up) in enumerate(writes):
                new = uploads[k]
                if name in fresh:
                    region.copy_(new)
                    continue
                width = DTYPES[entries[name].dtype].width
                undo.append(olds.pop(k, None) or _OldBytes.of(region, new, width))
                old = self._entries.get(name)
                if old is not None and self._chunk_bytes == chunk_bytes and i < len(old.chunks):
                    # (not fresh: the same shape, so the old chunk has this region's size)
                    previous[old.chunks[i]] = self._mirror.get(old.chunks[i], undo[-1])
                undo[-1].written = entries[name].chunks[i]
                # (the changed elements alone where they are known: a step's ~3% of them)
                _write_chunk(region, undo[-1].write(new))
                if patches is not None:
                    begin = tensor_spans(entries[name], chunk_bytes)[i][0]
                    patches.setdefault(name, []).append(undo[-1].changed(region, width, begin // width))
        except BaseException:
            for old in reversed(undo):
                old.restore()
            raise
        self.state_dict.update(fresh)
        if self._own:
            for gone in set(self.state_dict) - set(entries):
                del self.state_dict[gone]
        held = {c for e in entries.values() for c in e.chunks}
        self._mirror = {c: b for c, b in {**self._mirror, **mirror}.items() if c in held}
        if patches is not None:
            patches = {name: torch.cat(patches[name]) if name in patches else None for name in staged}
        return previous, patches

    def _check(self, entries: dict) -> None:
        """A given state dict must hold every tensor of the version, same shape and dtype,
        contiguous (it is written in place): one error listing what does not fit."""
        if self._accept is not None:
            self._accept(entries)
        if self._own:
            return
        import torch

        problems = []
        for name, e in entries.items():
            t = self.state_dict.get(name)
            dtype = getattr(torch, DTYPES[e.dtype].torch_name)
            if t is None:
                problems.append(f"{name} missing")
            elif tuple(t.shape) != tuple(e.shape) or t.dtype != dtype:
                problems.append(f"{name} is {tuple(t.shape)} {t.dtype}, the version has {tuple(e.shape)} {dtype}")
            elif not t.is_contiguous():
                problems.append(f"{name} is not contiguous")
        if problems:
            shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
            raise InvalidArgument(f"the state dict does not fit {self.source} {self.branch}: {shown}")


def follow(url_or_path, branch: str = "main", *, state_dict=None, device: str = "cpu", at: str | None = None,
           patches: bool = False, repository=None) -> Follower:
    """A :class:`Follower` of ``branch``: updates ``state_dict`` in place (on its tensors'
    devices), or tensors of its own on ``device``. ``at``: the commit ``state_dict`` already
    holds (checked), so that the first update reads only what changed since. ``patches``:
    each Update also names the changed elements of each tensor (``Update.patches``).
    ``repository``: a local clone of the remote (the one ``at`` was checked out of) whose
    chunks are used rather than downloaded: mid-run, the first update then reads one step."""
    return Follower(url_or_path, branch, state_dict=state_dict, device=device, at=at, patches=patches,
                    repository=repository)
