"""The commit graph: commits, trees and parents, and every SQL statement on them.

A commit row is added one way (:meth:`CommitGraph.add_commit`), with the bytes its objects
took in the store when they are known and ``None`` ("unknown") when they are not, so
``log`` shows the same thing however a commit arrived. Walks are iterative (a history of
any length is one loop) and never leave the commits this repository holds.
"""

from __future__ import annotations

import heapq

from .. import ids
from ..model import tree_diff
from ..errors import RevisionNotFound
from ..lru import LRUCache
from ..model.versions import Commit, Tree
from . import config_keys
from .database import Database

UNKNOWN = None  # stored bytes of a commit whose objects arrived without that figure


# A tree is stored whole or as a tree delta of its first parent's tree (model/tree_diff.py): at most
# LOCAL_DELTA_DEPTH deltas from a whole one, so reading a tree out of order applies at most that
# many; read in order (fsck, a push, a follower), each applies one, from the parsed trees kept.
LOCAL_DELTA_DEPTH = 16
# The repository format once `trees` holds a tree delta: a wvc that predates them would read
# one as a damaged tree, so its `Repo.open` refuses format "2" instead (repo.FORMATS).
TREE_DELTA_FORMAT = "2"
TREE_CACHE = LOCAL_DELTA_DEPTH + 8  # parsed trees kept (ids and chunk lists, no canonical bytes)


class CommitGraph:
    def __init__(self, db: Database):
        self.db = db
        # parsed trees by id (immutable values; a tree of 250,000 chunks takes a second to
        # parse, and a push with its followers' step records reads the last three versions')
        self._trees: LRUCache[str, Tree] = LRUCache(TREE_CACHE)

    # -- reading -----------------------------------------------------------------------------
    def has_commit(self, commit_id: str) -> bool:
        return self.db.one("SELECT 1 FROM commits WHERE id = ?", (commit_id,)) is not None

    def has_tree(self, tree_id: str) -> bool:
        return self.db.one("SELECT 1 FROM trees WHERE id = ?", (tree_id,)) is not None

    def read_commit(self, commit_id: str) -> Commit:
        data = self.db.one("SELECT data FROM commits WHERE id = ?", (commit_id,))
        if data is None:
            raise RevisionNotFound(f"commit {ids.short(commit_id)} is not in this repository")
        return Commit.from_bytes(data)

    def read_tree(self, tree_id: str) -> Tree:
        cached = self._trees.get(tree_id)
        if cached is not None and self.has_tree(tree_id):  # (gc may have dropped it since)
            return cached
        if not self.has_tree(tree_id):
            raise RevisionNotFound(f"tree {ids.short(tree_id)} is not in this repository")
        tree, built = tree_diff.resolve(tree_id, self.stored_tree, self._trees.get, "this repository")
        tree_diff.remember(self._trees, built)
        return tree

    def stored_tree(self, tree_id: str) -> bytes | None:
        """A tree as stored: its canonical bytes, or a tree delta (model/tree_diff.py)."""
        return self.db.one("SELECT data FROM trees WHERE id = ?", (tree_id,))

    def _head(self, tree_id: str):
        row = self.db.conn.execute("SELECT length(data), substr(data, 1, ?) FROM trees WHERE id = ?",
                                   (tree_diff.HEAD_BYTES, tree_id)).fetchone()
        return None if row is None else (row[0], bytes(row[1]))

    def tree_bytes(self, tree_id: str) -> bytes | None:
        """A tree's canonical bytes (what its id hashes), however it is stored; None if absent."""
        data = self.stored_tree(tree_id)
        if data is None or not tree_diff.is_delta(data):
            return data
        return self.read_tree(tree_id).to_bytes()

    def tree_of(self, commit_id: str) -> str | None:
        return self.db.one("SELECT tree FROM commits WHERE id = ?", (commit_id,))

    def stored_bytes(self, commit_id: str) -> int | None:
        return self.db.one("SELECT stored_bytes FROM commits WHERE id = ?", (commit_id,))

    def order_key(self, commit_id: str) -> tuple[int, int]:
        """(timestamp, insertion order): newest last; a child (added later) after its parent."""
        row = self.db.conn.execute("SELECT timestamp, rowid FROM commits WHERE id = ?", (commit_id,)).fetchone()
        return (row[0], row[1]) if row else (0, 0)

    def with_prefix(self, prefix: str, limit: int = 2) -> list[str]:
        return [r[0] for r in self.db.query("SELECT id FROM commits WHERE id >= ? AND id < ? LIMIT ?",
                                            (prefix, prefix + "g", limit))]

    def commit_ids(self) -> list[str]:
        return [r[0] for r in self.db.query("SELECT id FROM commits")]

    def count(self) -> int:
        return self.db.one("SELECT COUNT(*) FROM commits")

    def raw_commits(self):
        """(id, canonical bytes) of every commit, for fsck to re-verify."""
        return self.db.query("SELECT id, data FROM commits")

    def trees_of_commits(self):
        """(commit id, tree) of every commit whose tree is present, in the order they were added
        (so each tree delta is applied once, from the tree before it)."""
        rows = self.db.query("SELECT c.id, c.tree FROM commits c JOIN trees t ON t.id = c.tree ORDER BY c.rowid")
        for cid, tid in rows:
            yield cid, self.read_tree(tid)

    def children(self, commit_id: str) -> list[str]:
        """Commits that name ``commit_id`` as their first parent."""
        return [r[0] for r in self.db.query(
            "SELECT commit_id FROM commit_parents WHERE parent = ? AND position = 0", (commit_id,))]

    def pruned(self) -> set[str]:
        """Commits whose weights `wvc prune` dropped (their commit and tree stay)."""
        return {r[0] for r in self.db.query("SELECT commit_id FROM pruned_commits")}

    def is_pruned(self, commit_id: str) -> bool:
        return self.db.one("SELECT 1 FROM pruned_commits WHERE commit_id = ?", (commit_id,)) is not None

    def nearest_kept(self, commit_id: str, limit: int = 100_000) -> tuple[tuple[str, int] | None, tuple[str, int] | None]:
        """The closest versions along first parents whose weights are kept, before and after
        ``commit_id``, each with its distance in commits (None where there is none)."""
        pruned = self.pruned()

        def walk(step):
            cursor, n = commit_id, 0
            while n < limit:
                following = step(cursor)
                if not following:
                    return None
                cursor, n = following[0], n + 1
                if cursor not in pruned:
                    return cursor, n
            return None

        return walk(lambda c: self.parents(c)[:1]), walk(self.children)

    # -- adding (inside the caller's transaction) --------------------------------------------
    def add_tree(self, tree: Tree, base: str | None = None) -> None:
        """Record ``tree``: as a tree delta of ``base`` (its commit's first parent's tree) when
        only chunk ids changed, the chain stays within LOCAL_DELTA_DEPTH and its deltas together
        stay smaller than the whole tree (a step of a 250,000-chunk model: its 2,500 changed ids,
        not 17 MB); else whole."""
        if self.has_tree(tree.id):
            return
        whole = tree.to_bytes()
        stored = self._as_delta(tree, base, len(whole)) if base is not None and base != tree.id else None
        if stored is not None and self.db.get_config(config_keys.FORMAT) != TREE_DELTA_FORMAT:
            self.db.set_config(config_keys.FORMAT, TREE_DELTA_FORMAT)  # (the same transaction as the delta)
        self.db.conn.execute("INSERT OR IGNORE INTO trees VALUES (?, ?)", (tree.id, stored or whole))

    def _as_delta(self, tree: Tree, base: str, whole: int) -> bytes | None:
        if not self.has_tree(base):
            return None
        depth, size = tree_diff.chain(base, self._head, LOCAL_DELTA_DEPTH)
        if depth >= LOCAL_DELTA_DEPTH:
            return None
        changes = tree_diff.diff_trees(self.read_tree(base), tree)
        if changes is None:
            return None
        delta = tree_diff.encode_delta(base, changes)
        return delta if size + len(delta) < whole else None

    def add_commit(self, commit: Commit, stored_bytes: int | None, data: bytes | None = None) -> str:
        """Record ``commit`` (its tree already added). ``stored_bytes``: what its new objects
        take in the store, or UNKNOWN."""
        cid = commit.id
        self.db.conn.execute("INSERT OR IGNORE INTO commits VALUES (?, ?, ?, ?, ?)",
                             (cid, commit.tree, commit.timestamp, stored_bytes, data or commit.to_bytes()))
        self.db.conn.executemany("INSERT OR IGNORE INTO commit_parents VALUES (?, ?, ?)",
                                 [(cid, i, p) for i, p in enumerate(commit.parents)])
        return cid

    def mark_pruned(self, commit_ids, at: int) -> None:
        self.db.conn.executemany("INSERT OR IGNORE INTO pruned_commits VALUES (?, ?)", [(c, at) for c in commit_ids])

    def delete_commits(self, commit_ids) -> None:
        rows = [(c,) for c in commit_ids]
        self.db.conn.executemany("DELETE FROM pruned_commits WHERE commit_id = ?", rows)
        self.db.conn.executemany("DELETE FROM commits WHERE id = ?", rows)
        self.db.conn.executemany("DELETE FROM commit_parents WHERE commit_id = ?", rows)
        self.db.conn.executemany("DELETE FROM tensor_changes WHERE commit_id = ?", rows)
        self.db.conn.executemany("DELETE FROM changes_done WHERE commit_id = ?", rows)

    def delete_unreferenced_trees(self, keep=()) -> None:
        """Trees no commit points to, except ``keep`` (the base's tree, say) and the trees a kept
        tree delta is read from."""
        bases = {tid: tree_diff.base_of(bytes(head), tid) for tid, head in self.db.query(
            "SELECT id, substr(data, 1, ?) FROM trees WHERE substr(data, 1, ?) = ?",
            (tree_diff.HEAD_BYTES, len(tree_diff.DELTA_MAGIC), tree_diff.DELTA_MAGIC))}
        needed, stack = set(), [r[0] for r in self.db.query("SELECT tree FROM commits")] + list(keep)
        while stack:
            tid = stack.pop()
            if tid not in needed:
                needed.add(tid)
                if tid in bases:
                    stack.append(bases[tid])
        doomed = [(tid,) for (tid,) in self.db.query("SELECT id FROM trees") if tid not in needed]
        self.db.conn.executemany("DELETE FROM trees WHERE id = ?", doomed)

    # -- walks -------------------------------------------------------------------------------
    def parents(self, commit_id: str) -> list[str]:
        return [r[0] for r in self.db.query(
            "SELECT parent FROM commit_parents WHERE commit_id = ? ORDER BY position", (commit_id,))]

    def ancestors(self, start, stop=frozenset()) -> list[str]:
        """Local commits reachable from ``start`` (an id or several), not walking past ``stop``."""
        out, seen = [], set()
        stack = [start] if isinstance(start, str) else list(start)
        while stack:
            cid = stack.pop()
            if cid in seen or cid in stop or not self.has_commit(cid):
                continue
            seen.add(cid)
            out.append(cid)
            stack.extend(self.parents(cid))
        return out

    def is_ancestor(self, old: str, new: str) -> bool:
        """Whether ``old`` is ``new`` or one of its ancestors."""
        if old == new:
            return True
        seen, stack = set(), [new]
        while stack:
            cid = stack.pop()
            if cid in seen:
                continue
            seen.add(cid)
            for p in self.parents(cid):
                if p == old:
                    return True
                stack.append(p)
        return False

    def merge_bases(self, a: str, b: str) -> list[str]:
        """The best common ancestors of ``a`` and ``b`` (none an ancestor of another), newest
        first, ties broken by id: criss-cross histories have several, and callers that need
        one take the first, the same one on every machine."""
        common = set(self.ancestors(a)) & set(self.ancestors(b))
        best = [c for c in common if not any(o != c and self.is_ancestor(c, o) for o in common)]
        return sorted(best, key=lambda c: (-self.order_key(c)[0], c))

    def newest_first(self, starts, limit: int | None = None):
        """Commits reachable from ``starts``, newest first, every child before its parents."""
        heap, seen = [], set(starts)
        for cid in starts:
            ts, rowid = self.order_key(cid)
            heapq.heappush(heap, ((-ts, -rowid), cid))
        n = 0
        while heap and (limit is None or n < limit):
            _, cid = heapq.heappop(heap)
            yield cid
            n += 1
            for p in self.parents(cid):
                if p not in seen and self.has_commit(p):
                    seen.add(p)
                    ts, rowid = self.order_key(p)
                    heapq.heappush(heap, ((-ts, -rowid), p))

    def in_insertion_order(self, commit_ids) -> list[str]:
        return sorted(commit_ids, key=lambda c: self.order_key(c)[1])
