"""The working tree: which files are tracked, and their content hashes (with a stat cache).

``status`` must be fast on a directory of many gigabytes, so a file whose size, mtime,
ctime and inode match the cache is not read again. As in git, an entry is trusted only if
the file's mtime is safely older than the moment the entry was recorded: a file modified
within the timestamp granularity of that moment could otherwise keep a stale hash.
"""

from __future__ import annotations

import os
import stat as statmod
import time
from dataclasses import dataclass
from pathlib import Path

import pathspec

from . import ids
from .errors import UnsafePath
from .fsutil import TEMP_PREFIX

IGNORE_FILE = ".wvcignore"
RACY_MARGIN_NS = 2_000_000_000  # coarser than any common file-system timestamp
READ_BLOCK = 8 << 20


@dataclass(frozen=True)
class ScanResult:
    files: list[str]  # sorted repository-relative POSIX paths
    skipped_symlinks: list[str]


def load_ignore(root: Path, extra: tuple[str, ...] = ()) -> pathspec.PathSpec:
    path = root / IGNORE_FILE
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines() if path.is_file() else []
    return pathspec.GitIgnoreSpec.from_lines([*lines, *extra])


def scan(root: Path, exclude: tuple[str, ...] = ()) -> ScanResult:
    """Regular files under ``root``, minus ``.wvc``, temp files and ``.wvcignore`` matches.

    Symlinks are never followed nor tracked: one pointing outside the tree must not pull
    foreign files into a commit.
    """
    spec = load_ignore(root, exclude)
    files, links = [], []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root).replace(os.sep, "/")
        rel_dir = "" if rel_dir == "." else rel_dir + "/"
        keep = []
        for d in sorted(dirnames):
            rel = rel_dir + d
            _check_name(rel)
            if (rel_dir == "" and d == ".wvc") or spec.match_file(rel + "/"):
                continue
            if os.path.islink(os.path.join(dirpath, d)):
                links.append(rel)
                continue
            keep.append(d)
        dirnames[:] = keep
        for f in filenames:
            rel = rel_dir + f
            _check_name(rel)
            if f.startswith(TEMP_PREFIX) or spec.match_file(rel):
                continue
            full = os.path.join(dirpath, f)
            st = os.lstat(full)
            if statmod.S_ISLNK(st.st_mode):
                links.append(rel)
            elif statmod.S_ISREG(st.st_mode):
                files.append(rel)
    return ScanResult(sorted(files), sorted(links))


def _check_name(rel: str) -> None:
    """Names must be UTF-8: a tree is JSON, and a name we cannot write down we cannot restore."""
    try:
        rel.encode("utf-8")
    except UnicodeEncodeError:
        raise UnsafePath(f"file name is not valid UTF-8: {rel!r} (rename it or add it to .wvcignore)") from None


def hash_file(path: Path) -> tuple[str, int]:
    h = ids.hasher(ids.FILE, all_cores=True)  # nothing else runs meanwhile
    size = 0
    with open(path, "rb") as fh:
        while block := fh.read(READ_BLOCK):
            h.update(block)
            size += len(block)
    return h.hexdigest(), size


class StatCache:
    """path -> content hash, valid while the file's stat signature is unchanged."""

    def __init__(self, db, root: Path):
        self.db = db
        self.root = root
        self.updates: list[tuple] = []

    @staticmethod
    def signature(st: os.stat_result) -> tuple[int, int, int, int]:
        return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)

    def cached_hash(self, relpath: str, st: os.stat_result) -> str | None:
        row = self.db.conn.execute(
            "SELECT size, mtime_ns, ctime_ns, ino, hash, recorded_ns FROM stat_cache WHERE path = ?", (relpath,)
        ).fetchone()
        if row is None or tuple(row[:4]) != self.signature(st):
            return None
        if st.st_mtime_ns >= row[5] - RACY_MARGIN_NS:
            return None  # racy: could have changed after it was recorded
        return row[4]

    def hash(self, relpath: str) -> str:
        """Content hash of a working-tree file, from the cache when trustworthy."""
        full = self.root / relpath
        st = os.stat(full)
        cached = self.cached_hash(relpath, st)
        if cached is not None:
            return cached
        digest, _ = hash_file(full)
        self.remember(relpath, st, digest)
        return digest

    def remember(self, relpath: str, st: os.stat_result, digest: str) -> None:
        self.updates.append((relpath, *self.signature(st), digest, time.time_ns()))

    def flush(self, in_transaction: bool = False) -> None:
        """Write remembered entries; outside a transaction, skip silently if locked."""
        if not self.updates:
            return
        sql = "INSERT OR REPLACE INTO stat_cache VALUES (?, ?, ?, ?, ?, ?, ?)"
        if in_transaction:
            self.db.conn.executemany(sql, self.updates)
        else:
            try:
                with self.db.write():
                    self.db.conn.executemany(sql, self.updates)
            except Exception:  # a busy repository only costs a re-hash next time
                pass
        self.updates = []

    def forget(self, relpaths) -> None:
        self.db.conn.executemany("DELETE FROM stat_cache WHERE path = ?", [(p,) for p in relpaths])
