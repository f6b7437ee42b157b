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
neighbouring chunks are fetched once (remotes/downloads.py).
"""

from __future__ import annotations

from pathlib import Path

from .. import ids
from ..basemodel.remote_chunks import RemoteBaseChunks
from ..codec.devices import resolve_device
from .cache import cache_root
from ..errors import MissingEntry, MissingObject, RevisionNotFound, VersionPruned
from ..model.versions import Tree
from ..store.refs import HEADS, TAGS
from ..store.revparse import match_prefix, resolve_with
from ..worktree.materialize import file_blocks
from ..basemodel.remote import base_directory, remote_base
from .tensors import tensor_from_chunks
from ..remotes import open_backend
from ..remotes.urls import HF, local_path, local_repository
from ..remotes.repository import RemoteRepository


class VersionView:
    """One version of a repository or a remote, read without checking it out (``wvc.open``).

    ``commit`` is its id, ``files`` its paths, ``tensors`` name -> (dtype, shape). Chunks are
    read on demand (from a remote: by range reads of only this version's chunks) and each is
    hash-verified before use."""

    def __init__(self, commit_id: str, tree: Tree, chunk_source):
        self.commit = commit_id
        self.tree = tree
        self.chunk_source = chunk_source  # id -> verified bytes (a store's get, or remotes/downloads.RemoteChunks)
        self._get = chunk_source
        self.files = [f.path for f in tree.files]
        self._entries = {t.name: t for f in tree.files for t in f.tensors}
        self.tensors = {n: (t.dtype, t.shape) for n, t in self._entries.items()}

    # the two reads worktree/materialize.py and read/tensors.py need from a store
    def get(self, chunk_id: str) -> bytes:
        """One chunk's bytes, verified."""
        return self._get(chunk_id)

    def get_many(self, chunk_ids):
        """Chunks' bytes in order, verified."""
        return map(self._get, chunk_ids)

    def tensor(self, name: str, device: str = "cpu"):
        """The tensor ``name`` on ``device``, decoded from its chunks alone."""
        device = resolve_device(device, allow_test_backend=False)
        entry = self._entries.get(name)
        if entry is None:
            raise MissingEntry(f"no tensor {name!r} in version {ids.short(self.commit)}")
        return tensor_from_chunks(self, entry, device)

    def iter_tensors(self, device: str = "cpu"):
        """Tensors one at a time: a model bigger than RAM can stream onto a GPU."""
        for name in self._entries:
            yield name, self.tensor(name, device)

    def state_dict(self, device: str = "cpu") -> dict:
        """Every tensor of the version by name."""
        return dict(self.iter_tensors(device))

    def read_file(self, path: str) -> bytes:
        """The bytes of the file at ``path`` (a repository path), exactly as committed."""
        entry = self.tree.by_path().get(path)
        if entry is None:
            raise MissingEntry(f"no file {path!r} in version {ids.short(self.commit)}")
        return b"".join(file_blocks(self, entry))


def open_version(url_or_path, rev: str = "HEAD", *, base_dir=None) -> VersionView:
    """``wvc.open``: version ``rev`` of a local repository or a remote (hf://, s3://, a
    directory), in the same REV grammar as the CLI (``main~2``, ``HEAD~1``, a tag, an id
    prefix). ``base_dir``: for a remote whose base model is a directory, where that model is
    on this machine (a path the remote records is never read)."""
    from ..api import Repo

    url_or_path = _hub_id_or_path(url_or_path)
    local = local_repository(url_or_path)
    if local is not None:
        repo = Repo.open(local)
        commit_id = repo.resolve(rev)
        return VersionView(commit_id, repo.tree_of(commit_id), repo.read_chunk)
    return open_remote_version(str(url_or_path), rev, base_dir=base_dir)


def open_remote_version(url: str, rev: str, cache_dir: Path | None = None, *, base_dir=None, held=None,
                        keep_keyframe=None) -> VersionView:
    """``cache_dir``: where the remote's immutable catalogs are kept once read (a follower
    polling a remote reads each catalog once). ``held`` and ``keep_keyframe``: a follower's
    chunks in hand and where it keeps keyframes (remotes/downloads.RemoteChunks)."""
    remote = RemoteRepository.open(open_backend(url), cache_dir)

    def read_commit(commit_id: str):
        return remote.commit(commit_id, f"{url} has no commit {ids.short(commit_id)}", RevisionNotFound)

    def root_of(root: str) -> str:
        if root == "HEAD":  # a remote's HEAD: its main branch (or its only one), as clone picks
            heads = sorted(r for r in remote.refs if r.startswith(HEADS))
            root = "main" if HEADS + "main" in heads else (heads[0][len(HEADS):] if len(heads) == 1 else root)
        for ref in (HEADS + root, TAGS + root, root):
            if (target := remote.refs.get(ref)) is not None:
                return target
        if ids.is_object_id(root):
            return root
        if (found := match_prefix(root, remote.contents.commits)) is not None:  # the catalogs list every commit
            return found
        raise RevisionNotFound(f"{url} has no branch, tag or commit {root!r}")

    commit_id = resolve_with(rev, root_of, lambda c: read_commit(c).parents)
    commit = read_commit(commit_id)
    if commit_id in remote.pruned:
        raise VersionPruned(f"version {ids.short(commit_id)} was pruned on {url} (wvc prune --remote): its log entry "
                            "stays, its weights are gone")
    tree = remote.tree(commit.tree)
    base_chunks = None
    if (base := remote_base(remote.base_record, url)) is not None:
        base_tree = tree if base.tree == commit.tree else remote.tree(base.tree)
        base_chunks = RemoteBaseChunks(base, base_tree, base_directory(base, url, base_dir))
    chunks = remote.chunks(base_chunks, held=held, keep_keyframe=keep_keyframe)
    return VersionView(commit_id, tree, chunks)


def _hub_id_or_path(url_or_path) -> str:
    """huggingface_hub's convention: ``team/model`` that is not a local path is a Hub repo."""
    import re

    text = str(url_or_path)
    if local_path(text) == text and not Path(text).exists() and re.fullmatch(r"[\w.-]+/[\w.-]+", text):
        return HF + text
    return text


def snapshot_download(url_or_path, revision: str = "main", *, cache_dir=None, progress=None, base_dir=None) -> Path:
    """A local directory holding the files of one version, for ``from_pretrained``.

    Materialized once into ``<cache>/trees/<tree id>`` (a tree id names the content, so any
    commit with the same files shares it): a later call for the same version writes nothing.
    Files are verified chunk by chunk as they are written (read lazily from a remote:
    only this version's chunks travel), into a temp directory renamed into place whole, so
    the cache never holds a half-written version.
    """
    import shutil
    import tempfile

    from ..worktree.materialize import write_file
    from ..progress import NULL
    from ..fsutil import resolve_inside, umask

    from .cache import cached_tree, offline, remember

    source = _hub_id_or_path(url_or_path)
    root = Path(cache_dir).expanduser() if cache_dir is not None else cache_root()
    remote = local_repository(source) is None
    if remote and offline():  # as huggingface_hub: the cached snapshot, no network at all
        if (hit := cached_tree(root, source, revision)) is not None:
            return hit
        raise MissingObject(f"HF_HUB_OFFLINE is set and version {revision!r} of {source} is not in the cache "
                       f"({root}); run once online, or pass a full commit id downloaded before")
    view = open_version(source, revision, base_dir=base_dir)
    target = root / "trees" / view.tree.id
    if remote:
        remember(root, source, revision, view.commit, view.tree.id)
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".wvc-tmp-", dir=target.parent))
    progress = progress or NULL
    try:
        progress.start(view.tree.logical_bytes, "download")
        for entry in view.tree.files:
            write_file(view, entry, resolve_inside(staging, entry.path), progress)
        progress.close()
        staging.chmod(0o777 & ~umask())  # mkdtemp made it 0700
        try:
            staging.rename(target)
        except OSError:  # another process put the same version there first: theirs is as good
            if not target.is_dir():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target