"""``wvc.open``: a lazy, read-only view of one version, local or remote.

    view = wvc.open("hf://team/model", "main")     # or a local repository path
    view.files                                     # paths, no weights downloaded
    view.tensors["lm_head.weight"]                 # (dtype, shape)
    w = view.tensor("lm_head.weight", device="cuda")
    for name, t in view.iter_tensors(device="cuda"): ...   # one tensor in memory at a time

A remote view reads the version's commit and tree (verified against their ids) and the
remote's pack indexes, then fetches each chunk it needs, and the delta bases that chunk
needs, with range reads into the packs. Every decoded chunk is checked against its id.
Decoded chunks are kept in a small LRU cache (bounded in bytes) so bases shared by
neighbouring chunks are fetched once.
"""

from __future__ import annotations

import collections
from pathlib import Path

from . import ids
from .errors import CorruptObject, RevisionNotFound, WvcError
from .objects import Commit, Tree
from .store.objects import decode_verified

CACHE_BYTES = 256 << 20


class MissingEntry(WvcError, KeyError):
    """A file or tensor name that the version does not have."""


class VersionView:
    def __init__(self, commit_id: str, tree: Tree, chunk_source):
        self.commit = commit_id
        self.tree = tree
        self._get = chunk_source
        self.files = [f.path for f in tree.files]
        self._entries = {t.name: t for f in tree.files for t in f.tensors}
        self.tensors = {n: (t.dtype, t.shape) for n, t in self._entries.items()}

    # the two reads ops.materialize and ops.tensors need from a store
    def get(self, chunk_id: str) -> bytes:
        return self._get(chunk_id)

    def get_many(self, chunk_ids):
        return map(self._get, chunk_ids)

    def tensor(self, name: str, device: str = "cpu"):
        from .ops.tensors import tensor_from_chunks

        entry = self._entries.get(name)
        if entry is None:
            raise MissingEntry(f"no tensor {name!r} in version {ids.short(self.commit)}")
        return tensor_from_chunks(self, entry, device)

    def iter_tensors(self, device: str = "cpu"):
        """Tensors one at a time: a model bigger than RAM can stream onto a GPU."""
        for name in self._entries:
            yield name, self.tensor(name, device)

    def state_dict(self, device: str = "cpu") -> dict:
        return dict(self.iter_tensors(device))

    def read_file(self, path: str) -> bytes:
        from .ops.materialize import file_blocks

        entry = self.tree.by_path().get(path)
        if entry is None:
            raise MissingEntry(f"no file {path!r} in version {ids.short(self.commit)}")
        return b"".join(file_blocks(self, entry))


class _RemoteChunks:
    """Chunk bytes by range reads into remote packs, verified, with an LRU cache."""

    def __init__(self, remote, index: dict, base_chunks=None):
        self.remote = remote
        self.index = index  # object id -> (pack name, PackEntry)
        self.base_chunks = base_chunks  # chunks of the remote's base model (never in its packs)
        self.cache: collections.OrderedDict[str, bytes] = collections.OrderedDict()
        self.cached = 0

    def __call__(self, oid: str, depth: int = 0) -> bytes:
        if oid in self.cache:
            self.cache.move_to_end(oid)
            return self.cache[oid]
        if oid not in self.index and self.base_chunks is not None and oid in self.base_chunks:
            raw = self.base_chunks(oid)
        elif depth > 10_000 or oid not in self.index:
            raise CorruptObject(f"remote has no object {ids.short(oid)}")
        else:
            pack, entry = self.index[oid]
            base = self(entry.base, depth + 1) if entry.base else None
            from .remotes.base import pack_path

            payload = self.remote.read_range(pack_path(pack), entry.offset, entry.length)
            raw = decode_verified(oid, payload, entry.raw_size, base, f"remote pack {pack[:12]}")
        self.cache[oid] = raw
        self.cached += len(raw)
        while self.cached > CACHE_BYTES and len(self.cache) > 1:
            _, old = self.cache.popitem(last=False)
            self.cached -= len(old)
        return raw


def open_version(url_or_path, rev: str = "HEAD") -> VersionView:
    from .repo import Repo

    path = Path(str(url_or_path))
    if "://" not in str(url_or_path) and (path / ".wvc").is_dir():
        repo = Repo.open(path)
        commit_id = repo.resolve(rev)
        return VersionView(commit_id, repo.tree_of(commit_id), repo.store.get)
    return _open_remote(str(url_or_path), "main" if rev == "HEAD" else rev)


def _open_remote(url: str, rev: str) -> VersionView:
    from .remotes import open_remote
    from .remotes.base import (MAX_INDEX_BYTES, MAX_SMALL_OBJECT, RemoteError, commit_path, pack_path,
                               parse_pack_index, tree_path)

    remote = open_remote(url)
    state = remote.state()
    commit_id = state.refs.get(f"refs/heads/{rev}") or state.refs.get(f"refs/tags/{rev}")
    if commit_id is None:
        if not ids.is_object_id(rev):
            raise RevisionNotFound(f"{url} has no branch or tag {rev!r}")
        commit_id = rev
    data = remote.read(commit_path(commit_id), MAX_SMALL_OBJECT)
    if data is None:
        raise RevisionNotFound(f"{url} has no commit {ids.short(commit_id)}")
    commit = Commit.from_bytes(data, expected_id=commit_id)
    tree_data = remote.read(tree_path(commit.tree), MAX_SMALL_OBJECT)
    if tree_data is None:
        raise RemoteError(f"{url} is missing tree {ids.short(commit.tree)}")
    tree = Tree.from_bytes(tree_data, expected_id=commit.tree)
    index = {}
    for name in state.packs:
        data = remote.read(pack_path(name, "idx"), MAX_INDEX_BYTES)
        if data is None:
            raise RemoteError(f"remote pack index {name[:12]} is missing")
        for entry in parse_pack_index(data, name):
            index.setdefault(entry.id, (name, entry))
    base_chunks = None
    from .ops.sync import remote_base

    if (base := remote_base(state, url)) is not None:
        from .ops.base_model import RemoteBaseChunks

        if base.tree == commit.tree:
            base_tree = tree
        else:
            base_data = remote.read(tree_path(base.tree), MAX_SMALL_OBJECT)
            if base_data is None:
                raise RemoteError(f"{url} is missing the base's tree {ids.short(base.tree)}")
            base_tree = Tree.from_bytes(base_data, expected_id=base.tree)
        base_chunks = RemoteBaseChunks(base, base_tree)
    return VersionView(commit_id, tree, _RemoteChunks(remote, index, base_chunks))
