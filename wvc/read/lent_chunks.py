"""A local repository's chunks, lent to a follower of a remote (``wvc.follow(..., repository=)``).

A server started mid-run from ``wvc checkout X`` of a clone holds X; the remote's step record of
X+1 is coded in the context of the version before X (codec/step_coder.py), which nothing the
follower holds gives, so without help its first update reads X+1 through its chains: about the
model (issue 65). The clone's store holds that version's chunks already. A follower lent the
clone's chunks decodes them locally where a record or a delta names them, and downloads only
the step.

Only what the store holds is lent: a chunk whose chain is not all local (a lazy clone's, before
its first use) is not asked of the clone's remote here. Every chunk decoded from the lent
store is hash-checked (ObjectStore.decode_chain), and what the follower decodes over it is
checked against its own id again: a stale or damaged clone costs a download, never wrong bytes.
"""

from __future__ import annotations

import threading
from pathlib import Path

from ..errors import CorruptObject, InvalidArgument, MissingObject
from ..remotes.urls import local_repository
from ..store.chains import resolve_chain

# chain rows remembered between lookups (a chunk is asked "in?" and then "bytes?" from the
# record's decode): bounded, as a server lives for a whole run
_KNOWN_CHAINS = 1 << 16


class LentChunks:
    """``oid in lent`` and ``lent[oid]`` (its bytes) over the store of the repository at ``path``.
    Safe from the codec pool's threads: the database lookups take a lock, the decode does not."""

    def __init__(self, path):
        from ..repo import Repository

        root = local_repository(str(path))
        if root is None:
            raise InvalidArgument(f"{path} holds no wvc repository (a follower's repository= must be a clone)")
        self.root = Path(root)
        self._store = Repository(self.root).store
        self._lock = threading.Lock()
        self._chains: dict[str, list | None] = {}

    def _chain(self, oid: str) -> list | None:
        with self._lock:
            if oid in self._chains:
                return self._chains[oid]
            try:  # rows only: no lazy clone's supply is asked (a download the caller did not choose)
                chain = resolve_chain(oid, self._store.row, max_links=self._store.max_links,
                                      where=f"the repository at {self.root}")
            except (MissingObject, CorruptObject):  # (not lent: the follower downloads it)
                chain = None
            if len(self._chains) >= _KNOWN_CHAINS:
                self._chains.clear()
            self._chains[oid] = chain
            return chain

    def __contains__(self, oid) -> bool:
        return self._chain(oid) is not None

    def __getitem__(self, oid) -> bytes:
        chain = self._chain(oid)
        if chain is None:
            raise MissingObject(f"the repository at {self.root} does not hold chunk {oid[:12]}")
        try:
            return self._store.decode_chain(chain)
        except CorruptObject:  # (a damaged clone: not lent again)
            with self._lock:
                self._chains[oid] = None
            raise
