"""The commit graph: commits, trees and parents, and every SQL statement on them.

A commit row is added one way (:meth:`CommitGraph.add_commit`), with the bytes its objects
took in the store when they are known and ``None`` ("unknown") when they are not, so
``log`` shows the same thing however a commit arrived. Walks are iterative (a history of
any length is one loop) and never leave the commits this repository holds.
"""

from __future__ import annotations

import heapq

from .. import ids
from ..errors import RevisionNotFound
from ..versions import Commit, Tree
from .database import Database

UNKNOWN = None  # stored bytes of a commit whose objects arrived without that figure


TREE_CACHE = 8  # parsed trees kept: a push, its step records and a commit read the last few again


class CommitGraph:
    def __init__(self, db: Database):
        import collections
        import threading

        self.db = db
        # parsed trees by id (immutable values; a tree of 250,000 chunks takes a second to
        # parse, and a push with its followers' step records reads the last three versions')
        self._trees: "collections.OrderedDict[str, Tree]" = collections.OrderedDict()
        self._trees_lock = threading.Lock()

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
        with self._trees_lock:
            cached = self._trees.get(tree_id)
            if cached is not None:
                self._trees.move_to_end(tree_id)
        if cached is not None and self.has_tree(tree_id):  # (gc may have dropped it since)
            return cached
        data = self.db.one("SELECT data FROM trees WHERE id = ?", (tree_id,))
        if data is None:
            raise RevisionNotFound(f"tree {ids.short(tree_id)} is not in this repository")
        tree = Tree.from_bytes(data)
        with self._trees_lock:
            self._trees[tree_id] = tree
            while len(self._trees) > TREE_CACHE:
                self._trees.popitem(last=False)
        return tree

    def tree_bytes(self, tree_id: str) -> bytes | None:
        return self.db.one("SELECT data FROM trees WHERE id = ?", (tree_id,))

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
        """(commit id, tree bytes) of every commit whose tree is present."""
        return self.db.query("SELECT c.id, t.data FROM commits c JOIN trees t ON t.id = c.tree")

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
    def add_tree(self, tree: Tree, data: bytes | None = None) -> None:
        self.db.conn.execute("INSERT OR IGNORE INTO trees VALUES (?, ?)", (tree.id, data or tree.to_bytes()))

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
        """Trees no commit points to, except ``keep`` (the base's tree, say)."""
        self.db.conn.execute("DELETE FROM trees WHERE id NOT IN (SELECT tree FROM commits)"
                             + (f" AND id NOT IN ({','.join('?' * len(keep))})" if keep else ""), tuple(keep))

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
