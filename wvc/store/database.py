"""The SQLite database: connection settings, transactions and recorded migrations.

WAL lets readers (``log``, ``status``) run beside a writer; writers take the lock up front
with ``BEGIN IMMEDIATE`` so two committers serialise instead of failing mid-transaction;
``synchronous=FULL`` makes a committed ref move survive power loss.

Migrations are written with sqlite-utils, imported only when one is pending: it costs
~130 ms to import, which every ``wvc status`` would otherwise pay.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from pathlib import Path

from ..errors import DatabaseUnavailable, LockedError

BUSY_TIMEOUT_MS = 30_000
PEEK_TIMEOUT_S = 5  # a look at what is there before opening: a lock held longer is reported, not waited out


def _m0001_initial(db: "sqlite_utils.Database") -> None:
    db["config"].create({"key": str, "value": str}, pk="key")
    db["packs"].create({"name": str, "size": int, "objects": int, "created_at": int}, pk="name")
    db["objects"].create(
        {
            "id": str,
            "pack": str,
            "offset": int,
            "length": int,
            "raw_size": int,
            "method": int,
            "base": str,
            "depth": int,
        },
        pk="id",
        not_null={"pack", "offset", "length", "raw_size", "method", "depth"},
    )
    db["objects"].create_index(["pack"])
    db["objects"].create_index(["base"])
    db["trees"].create({"id": str, "data": bytes}, pk="id", not_null={"data"})
    db["commits"].create(
        {"id": str, "tree": str, "timestamp": int, "stored_bytes": int, "data": bytes},
        pk="id",
        not_null={"tree", "timestamp", "data"},
    )
    db["commit_parents"].create({"commit_id": str, "position": int, "parent": str}, pk=("commit_id", "position"))
    db["commit_parents"].create_index(["parent"])
    db["refs"].create({"name": str, "target": str}, pk="name", not_null={"target"})
    db["reflog"].create(
        {"seq": int, "ref": str, "old": str, "new": str, "time": int, "message": str}, pk="seq"
    )
    db["stat_cache"].create(
        {"path": str, "size": int, "mtime_ns": int, "ctime_ns": int, "ino": int, "hash": str, "recorded_ns": int},
        pk="path",
    )


def _m0002_external_objects(db: "sqlite_utils.Database") -> None:
    # chunks of a base model read in place from its files (store/external.py), never copied
    db["external_objects"].create({"id": str, "path": str, "offset": int, "length": int}, pk="id",
                                  not_null={"path", "offset", "length"})


def _m0003_stat_cache_content_ids(db: "sqlite_utils.Database") -> None:
    # tree format 2 compares files by content id (from the chunk list, so per chunk size);
    # the cached hashes of file bytes are of no use to it
    db.execute("DELETE FROM stat_cache")
    db["stat_cache"].add_column("chunk_bytes", int)


def _m0004_stat_cache_executable_bit(db: "sqlite_utils.Database") -> None:
    # tree format 3 puts the executable bit in a file's content id; ids cached before it
    # would call a chmod +x file unchanged
    db.execute("DELETE FROM stat_cache")


def _m0005_tensor_changes(db: "sqlite_utils.Database") -> None:
    # per commit, each tensor's change against the first parent (store/change_table.py): what
    # `wvc ui` and `wvc plot` draw, computed once and kept
    db.execute("CREATE TABLE tensor_changes (commit_id TEXT NOT NULL, parent TEXT, file TEXT NOT NULL, "
               "tensor TEXT NOT NULL, status TEXT NOT NULL, numel INTEGER, changed INTEGER, max_abs_delta REAL, "
               "max_ulps INTEGER, rel_l2 REAL, stored_bytes INTEGER, PRIMARY KEY (commit_id, file, tensor))")
    db.execute("CREATE TABLE changes_done (commit_id TEXT PRIMARY KEY, parent TEXT)")


def _m0006_pruned_commits(db: "sqlite_utils.Database") -> None:
    # commits whose weights `wvc prune` dropped: they stay in the log (message, metadata,
    # tree, change statistics); their chunks are no longer kept (ops/prune.py)
    db.execute("CREATE TABLE pruned_commits (commit_id TEXT PRIMARY KEY, pruned_at INTEGER NOT NULL)")
    # chunks a prune re-encoded against a new base: a ULP_STEP payload's context is its
    # base's base, so no new payload takes one of these as a base with a context (another
    # store may hold the same chunk on its old base)
    db.execute("CREATE TABLE reencoded_objects (id TEXT PRIMARY KEY)")


def _m0007_anchor_positions(db: "sqlite_utils.Database") -> None:
    # a chunk's position on its line since its root: the anchor policy's bookkeeping
    # (store/anchors.py); no row: a root (a keyframe, a fetched or a re-encoded chunk)
    db.execute("CREATE TABLE anchor_positions (id TEXT PRIMARY KEY, position INTEGER NOT NULL)")


MIGRATIONS = [
    ("0001_initial", _m0001_initial),
    ("0002_external_objects", _m0002_external_objects),
    ("0003_stat_cache_content_ids", _m0003_stat_cache_content_ids),
    ("0004_stat_cache_executable_bit", _m0004_stat_cache_executable_bit),
    ("0005_tensor_changes", _m0005_tensor_changes),
    ("0006_pruned_commits", _m0006_pruned_commits),
    ("0007_anchor_positions", _m0007_anchor_positions),
]


class Database:
    def __init__(self, path: Path):
        self.path = path
        self.conn = sqlite3.connect(path, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=False)
        self.conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=FULL")

    def close(self) -> None:
        self.conn.close()

    @contextlib.contextmanager
    def write(self):
        """One write transaction, taken up front (BEGIN IMMEDIATE); rolled back on error."""
        try:
            self.conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            raise LockedError(f"repository is locked by another wvc process ({exc})") from exc
        try:
            yield self.conn
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        else:
            self.conn.execute("COMMIT")

    def query(self, sql: str, params=()) -> list[tuple]:
        return self.conn.execute(sql, params).fetchall()

    def one(self, sql: str, params=()):
        row = self.conn.execute(sql, params).fetchone()
        return row[0] if row else None

    def migrate(self) -> list[str]:
        """Apply pending migrations, each in its own transaction, recording its name."""
        try:
            done = {r[0] for r in self.query("SELECT name FROM migrations")}
        except sqlite3.OperationalError:  # a new database
            with self.write():
                self.conn.execute("CREATE TABLE IF NOT EXISTS migrations (name TEXT PRIMARY KEY, applied_at INTEGER)")
            done = set()
        if all(name in done for name, _ in MIGRATIONS):
            return []
        import sqlite_utils

        db = sqlite_utils.Database(self.conn)
        applied = []
        for name, step in MIGRATIONS:
            if name in done:
                continue
            with self.write():
                if self.one("SELECT 1 FROM migrations WHERE name = ?", (name,)):
                    continue  # another process applied it meanwhile
                step(db)
                self.conn.execute("INSERT INTO migrations VALUES (?, ?)", (name, int(time.time())))
            applied.append(name)
        return applied

    def get_config(self, key: str, default: str | None = None) -> str | None:
        value = self.one("SELECT value FROM config WHERE key = ?", (key,))
        return default if value is None else value

    def set_config(self, key: str, value: str) -> None:
        self.conn.execute("INSERT OR REPLACE INTO config VALUES (?, ?)", (key, value))

    def delete_config(self, key: str) -> None:
        self.conn.execute("DELETE FROM config WHERE key = ?", (key,))

    def config_like(self, pattern: str) -> list[tuple[str, str]]:
        """(key, value) of the settings whose key matches the SQL LIKE ``pattern``, by key."""
        return self.query("SELECT key, value FROM config WHERE key LIKE ? ORDER BY key", (pattern,))

    def integrity_check(self) -> str:
        return self.one("PRAGMA integrity_check")


def _peek(path: Path, read):
    """``read(conn)`` on a read-only connection to the database at ``path``, without
    migrating it; a database that cannot be read (locked by another process, not readable by
    this user, damaged) raises :class:`DatabaseUnavailable` saying which."""
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=PEEK_TIMEOUT_S)
    except sqlite3.Error as exc:
        raise unavailable(path, exc) from exc
    try:
        return read(conn)
    except sqlite3.Error as exc:
        raise unavailable(path, exc) from exc
    finally:
        conn.close()


def _has_table(conn, table: str) -> bool:
    return conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)).fetchone() is not None


def peek_config(path: Path, key: str) -> tuple[bool, str | None]:
    """One config entry of the database at ``path``: (whether it has a config table, the
    value or None). Used to recognise what a killed init or clone left, so it answers only
    from what it read: a database it cannot read is never taken for a killed init."""

    def read(conn):
        if not _has_table(conn, "config"):
            return False, None
        row = conn.execute("SELECT value FROM config WHERE key = ?", (key,)).fetchone()
        return True, row[0] if row else None

    return _peek(path, read)


def has_rows(path: Path, table: str) -> bool:
    """Whether ``table`` exists in the database at ``path`` and holds a row."""
    return _peek(path, lambda conn: _has_table(conn, table)
                 and conn.execute(f'SELECT 1 FROM "{table}" LIMIT 1').fetchone() is not None)


def unavailable(path: Path, exc: sqlite3.Error) -> "DatabaseUnavailable":
    """What a user is told when the repository database at ``path`` cannot be read."""
    text = str(exc)
    if "locked" in text or "busy" in text:
        return DatabaseUnavailable(f"{path} is locked by another process; try again when it is done")
    if not os.access(path, os.R_OK) or not os.access(path.parent, os.R_OK | os.X_OK) or "unable to open" in text:
        return DatabaseUnavailable(f"{path}: permission denied (or it cannot be opened): "
                                   "check the ownership and modes of .wvc/")
    return DatabaseUnavailable(f"{path} is damaged ({text}): see `wvc fsck`; nothing was changed")
