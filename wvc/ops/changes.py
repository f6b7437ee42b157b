"""Changes along a history: each commit's per-tensor change against its first parent (the
numbers `wvc diff PARENT COMMIT` gives: elements changed, max |delta|, max ULPs, relative
L2, stored bytes), computed once and kept in the repository database (store/change_table.py).

Computing them for a history that lacks them walks it parent first and decodes only the
chunks that changed, with the chunks decoded for one commit cached for the next (a commit's
new chunks are its child's old ones): about one decode of each changed chunk, less than a
checkout of each commit.
"""

from __future__ import annotations


from ..errors import RevisionNotFound
from ..lru import LRUCache
from ..progress import NULL, Progress
from ..store.change_table import ChangeStats, TensorChange
from ..model.versions import Tree, first_parents
from .diff import diff

CACHE_BYTES = 256 << 20  # decoded chunks kept between consecutive commits


def first_parent_history(repo, rev: str = "HEAD", limit: int | None = None) -> list[str]:
    """The commits from ``rev`` back along first parents, oldest first (at most ``limit``)."""
    return first_parents(repo.read_commit, repo.resolve(rev), limit)[::-1]


class _ChunkCache:
    """Decoded chunks by id, bounded in bytes. ``prefetch`` hands a commit's chunks to the
    codec pool (their chains looked up here, on the calling thread: the pool only decodes), so
    the next commit decodes while this one is compared."""

    def __init__(self, store, max_bytes: int = CACHE_BYTES):
        self.store = store
        self.decoded: LRUCache[str, bytes] = LRUCache(max_bytes, weight=len)
        self.pending: dict[str, object] = {}  # id -> Future of its bytes

    def prefetch(self, chunk_ids) -> None:
        from ..codec.pool import pool

        for chunk_id in dict.fromkeys(chunk_ids):
            if chunk_id not in self.decoded and chunk_id not in self.pending:
                self.pending[chunk_id] = pool().submit(self.store.decode_chain, self.store.chain(chunk_id))

    def __call__(self, chunk_id: str) -> bytes:
        raw = self.decoded.get(chunk_id)
        if raw is None:
            future = self.pending.pop(chunk_id, None)
            raw = future.result() if future is not None else self.store.get(chunk_id)
            self.decoded.put(chunk_id, raw)
        return raw


def missing_changes(repo, commits) -> list[str]:
    """Those of ``commits`` whose changes are not kept yet, in order."""
    done = ChangeStats(repo.db).done(commits)
    return [c for c in commits if c not in done]


def ensure_changes(repo, commits, progress: Progress = NULL) -> int:
    """Compute and keep the changes of those of ``commits`` that lack them (parent first);
    returns how many were computed."""
    stats = ChangeStats(repo.db)
    missing = missing_changes(repo, commits)
    if not missing:
        return 0
    cache, norms = _ChunkCache(repo.store), {}
    progress.start(len(missing), "computing changes", unit="commits")

    def sides(commit: str):
        parents = repo.read_commit(commit).parents
        tree = repo.tree_of(commit)
        return (parents[0] if parents else None), tree, (repo.tree_of(parents[0]) if parents else Tree((), tree.chunk_bytes))

    upcoming = sides(missing[0])
    cache.prefetch(_changed_chunks(upcoming[2], upcoming[1]))
    for k, commit in enumerate(missing):
        parent, tree, before = upcoming
        if k + 1 < len(missing):  # decoded on the pool while this commit is compared
            upcoming = sides(missing[k + 1])
            cache.prefetch(_changed_chunks(upcoming[2], upcoming[1]))
        result = diff(repo, parent, commit, get=cache, norms=norms, tree_a=None if parent else before)
        changes = [TensorChange(t["file"], t["name"], t["status"], t["numel"], t["changed"], t["max_abs_delta"],
                                t["max_ulps"], t["rel_l2"], t["stored_bytes"]) for t in result["tensors"]]
        with repo.db.write():
            stats.put(commit, parent, changes)
        progress.advance(1)
    progress.close()
    return len(missing)


def _changed_chunks(before: Tree, after: Tree) -> list[str]:
    """The chunks of the tensors whose chunk lists differ between two trees, both sides:
    what the diff decodes (a commit's new chunks, and the old ones they replace)."""
    old = {(f.path, t.name): t for f in before.files for t in f.tensors}
    out = []
    for f in after.files:
        for t in f.tensors:
            o = old.get((f.path, t.name))
            if o is not None and o.chunks != t.chunks and o.dtype == t.dtype and o.shape == t.shape:
                out += [*o.chunks, *t.chunks]
    return out


def changes_of(repo, commit: str) -> list[TensorChange]:
    """A commit's kept changes (ensure_changes first)."""
    if not ChangeStats(repo.db).done([commit]):
        raise RevisionNotFound(f"no changes computed for {commit[:12]}")
    return ChangeStats(repo.db).get(commit)
