"""A lazy clone's chunk supply: commits and trees are local, chunks come on first use.

``wvc clone --lazy`` records ``lazy.remote``; the repository then builds its object store
with a :class:`LazyRemote` (wvc/repo.py), which the store asks for any chunk none of its
packs hold. Each request range-reads the chunks and the delta bases they need from the
remote's packs, verifies them object by object like a fetch, and records them in one
transaction (remotes/transfer.py). A checkout of one version downloads that version only.
"""

from __future__ import annotations

from pathlib import Path

from ..progress import NULL, Progress
from . import lazy_remote_name, open_remote, remote_url
from .transfer import fetch_objects, remote_contents


class LazyRemote:
    """ChunkSupply (store/objects.py) backed by the remote a lazy clone came from."""

    def __init__(self, db, index_cache: Path, work_dir: Path):
        self.db = db
        self.index_cache = index_cache
        self.work_dir = work_dir
        self.downloaded_bytes = 0

    def supply(self, store, object_ids, progress: Progress = NULL) -> None:
        name = lazy_remote_name(self.db)
        if name is None:
            return
        remote = open_remote(remote_url(self.db, name))
        index = remote_contents(remote, remote.state(), self.index_cache).index
        self.downloaded_bytes += fetch_objects(store, remote, index, object_ids, self.work_dir, progress)
