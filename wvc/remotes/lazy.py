"""A lazy clone's chunk supply: commits and trees are local, chunks come on first use.

``wvc clone --lazy`` records ``lazy.remote``; the repository then builds its object store
with a :class:`LazyRemote` (wvc/repo.py), which the store asks for any chunk none of its
packs hold. Each request range-reads the chunks and the delta bases they need from the
remote's packs, verifies them object by object like a fetch, and records them in one
transaction (remotes/downloads.py). A checkout of one version downloads that version only.

The remote is listed once for as long as the repository is open (a tensor of eight chunks
asks eight times; each listing on the Hub is several requests), and listed again only
when what that listing said no longer holds (a compaction since replaced a pack).
"""

from __future__ import annotations

from pathlib import Path

from ..errors import MissingObject, RemoteError
from ..progress import NULL, Progress
from . import lazy_remote_name, open_backend, remote_url
from .repository import RemoteRepository
from .downloads import fetch_objects


class LazyRemote:
    """ChunkSupply (store/chunks.py) backed by the remote a lazy clone came from."""

    def __init__(self, db, index_cache: Path, work_dir: Path):
        self.db = db
        self.index_cache = index_cache
        self.work_dir = work_dir
        self.downloaded_bytes = 0
        self.pinned: RemoteRepository | None = None

    def use(self, remote: RemoteRepository) -> None:
        """Read chunks through ``remote``, listed already by the caller (a lazy clone)."""
        self.pinned = remote

    def supply(self, store, object_ids, progress: Progress = NULL) -> None:
        name = lazy_remote_name(self.db)
        if name is None:
            return
        fresh = self.pinned is None
        if fresh:
            self._list(name)
        try:
            self._fetch(store, object_ids, progress)
        except (RemoteError, MissingObject):
            if fresh:
                raise
            self._list(name)  # the listing may be out of date (a pack compacted away, a chunk pushed since)
            self._fetch(store, object_ids, progress)

    def _list(self, name: str) -> None:
        self.pinned = RemoteRepository.open(open_backend(remote_url(self.db, name)), self.index_cache)

    def _fetch(self, store, object_ids, progress: Progress) -> None:
        remote = self.pinned
        before = remote.downloaded_bytes
        fetch_objects(store, remote.backend, remote.index, object_ids, self.work_dir, progress)
        self.downloaded_bytes += remote.downloaded_bytes - before
