"""The working tree: which files are tracked, and their content ids (with a stat cache).

A working file's content id is the one a commit would record for it (FileEntry.content_id,
from its chunk list), so it depends on the chunk size of the tree it is compared with.
``status`` must be fast on a directory of many gigabytes, so a file whose size, mtime,
ctime and inode match the cache is not read again. As in git, an entry is trusted only if
the file's mtime is safely older than the moment the entry was recorded: a file modified
within the timestamp granularity of that moment could otherwise keep a stale hash.
"""

from __future__ import annotations

import logging
import os
import stat as statmod
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from .. import ids
from ..errors import UnsafePath, WvcError
from ..formats import safetensors as st
from ..fsutil import TEMP_PREFIX, folded_clashes, reserved_name, validate_relpath
from ..model.chunk_spans import chunk_spans
from ..model.versions import FileEntry, TensorEntry

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    import pathspec

IGNORE_FILE = ".wvcignore"
RACY_MARGIN_NS = 2_000_000_000  # coarser than any common file-system timestamp


# Ignored unless .wvcignore re-includes them with "!": a git repository's own store (with
# .git/lfs/objects, the weights a second time) and huggingface_hub's cache inside a model
# directory. docs/worktree.md lists them.
DEFAULT_IGNORES = (".git/", ".cache/huggingface/")


@dataclass(frozen=True)
class ScanResult:
    files: list[str]  # sorted repository-relative POSIX paths (symlinked files included)
    skipped_symlinks: list[str]  # dangling, or to a directory: never committed, always reported
    linked_files: list[str] = field(default_factory=list)  # symlinks to files: committed as their content
    nested_repositories: list[str] = field(default_factory=list)  # directories with their own .wvc/
    bad_names: list[tuple[str, str]] = field(default_factory=list)  # (path, why no tree can hold it)

    def refuse_bad_names(self) -> None:
        """A commit stops at the first name a tree would refuse: storing it would make the
        repository unreadable, and skipping it would lose the file silently."""
        if self.bad_names:
            path, why = self.bad_names[0]
            more = f" (and {len(self.bad_names) - 1} more)" if len(self.bad_names) > 1 else ""
            raise UnsafePath(f"cannot commit {path!r}{more}: {why}; rename it or add it to {IGNORE_FILE}")


def load_ignore(root: Path, extra: tuple[str, ...] = ()) -> pathspec.PathSpec | None:
    """The default ignores, ``.wvcignore``'s patterns and ``extra``; None when there are no
    patterns beyond the defaults (then pathspec, ~15 ms of every command's start, is not
    imported and ``default_ignored`` applies the defaults)."""
    path = root / IGNORE_FILE
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines() if path.is_file() else []
    lines += extra
    for n, line in enumerate(lines, 1):
        text = line.strip()
        if text.startswith("!") and any(reserved_name(part) == ".git" for part in text[1:].strip("/").split("/")):
            raise UnsafePath(f"{IGNORE_FILE} line {n}: {text!r} would commit a .git directory; wvc never does "
                             "(a clone would run its hooks and configuration): remove the line")
    if not any(line.strip() and not line.lstrip().startswith("#") for line in lines):
        return None
    import pathspec

    return pathspec.GitIgnoreSpec.from_lines([*DEFAULT_IGNORES, *lines])


def default_ignored(rel: str) -> bool:
    """DEFAULT_IGNORES without pathspec (``rel`` of a directory ends with "/")."""
    return rel.endswith("/") and (rel.rsplit("/", 2)[-2] == ".git" or rel == ".cache/huggingface/")


def _reserved(name: str) -> bool:
    return name.lower() == ".wvc"


def scan(root: Path, exclude: tuple[str, ...] = ()) -> ScanResult:
    """Files under ``root`` a commit would record, minus ``.wvc``, temp files and ignores.

    A symlink to a regular file counts as that file (its content is committed: the layout
    of huggingface_hub's cache and ``snapshot_download``); a symlink to a directory, or a
    dangling one, is reported and never followed. A directory holding its own ``.wvc`` is
    a nested repository, skipped whole like a git submodule. Names no tree can hold are
    collected in ``bad_names`` (commit refuses them, status reports them).
    """
    spec = load_ignore(root, exclude)
    ignored: Callable[[str], bool] = spec.match_file if spec is not None else default_ignored
    files, linked, links, nested, bad = [], [], [], [], []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root).replace(os.sep, "/")
        rel_dir = "" if rel_dir == "." else rel_dir + "/"
        keep = []
        for d in sorted(dirnames):
            rel = rel_dir + d
            full = os.path.join(dirpath, d)
            if reserved_name(d) == ".git":  # a git repository's store, in any spelling: never tracked
                continue
            if _reserved(d):  # ours at the top; elsewhere the parent was a nested repository
                if rel_dir and not os.path.islink(full):
                    nested.append(rel_dir.rstrip("/"))
                continue
            if ignored(rel + "/"):
                continue
            if os.path.islink(full):
                links.append(rel)
                continue
            if (why := _name_problem(rel)) is not None:
                bad.append((rel + "/", why))
                continue
            if any(_reserved(name) and os.path.isdir(os.path.join(full, name)) for name in _listdir(full)):
                nested.append(rel)
                continue
            keep.append(d)
        dirnames[:] = keep
        for f in filenames:
            rel = rel_dir + f
            if f.startswith(TEMP_PREFIX) or _reserved(f) or reserved_name(f) == ".git" or ignored(rel):
                continue
            if (why := _name_problem(rel)) is not None:
                bad.append((rel, why))
                continue
            full = os.path.join(dirpath, f)
            st = os.lstat(full)
            if statmod.S_ISLNK(st.st_mode):
                try:
                    regular = statmod.S_ISREG(os.stat(full).st_mode)
                except OSError:  # dangling, or a loop
                    regular = False
                if regular:
                    files.append(rel)
                    linked.append(rel)
                else:
                    links.append(rel)
            elif statmod.S_ISREG(st.st_mode):
                files.append(rel)
    for a, b in folded_clashes(files):
        bad.append((b, f"it and {a!r} are one name on case-insensitive or Unicode-normalising file systems "
                       "(macOS, Windows, SMB shares)"))
        if b in files:
            files.remove(b)
    return ScanResult(sorted(files), sorted(links), sorted(linked), sorted(set(nested)), sorted(bad))


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _name_problem(rel: str) -> str | None:
    """Why a tree could not hold ``rel`` (the rules of fsutil.validate_relpath), or None."""
    try:
        validate_relpath(rel)
    except UnsafePath as exc:
        return str(exc)
    return None


def is_executable(st: os.stat_result) -> bool:
    return bool(st.st_mode & statmod.S_IXUSR)


def content_id(path: Path, relpath: str, chunk_bytes: int) -> str:
    """The content id a commit with ``chunk_bytes`` would record for the file at ``path``.

    Chunked exactly as ops/snapshot.py chunks it (a test holds the two together). A
    ``.safetensors`` file whose header does not parse is taken as a blob: a commit refuses
    such a file, so no tracked entry can match it and status calls it modified.
    """
    with open(path, "rb") as fh:
        stat = os.fstat(fh.fileno())
        size, executable = stat.st_size, is_executable(stat)
        if relpath.endswith(".safetensors"):
            try:
                header = st.read_header(fh, size, relpath)
            except WvcError:
                header = None
            if header is not None:
                return _safetensors_entry(fh, relpath, header, chunk_bytes, executable).content_id
            fh.seek(0)
        chunks = tuple(_chunk_id(fh, end - begin) for begin, end in chunk_spans(size, 1, chunk_bytes))
        return FileEntry.of(relpath, "blob", size, chunks=chunks, executable=executable).content_id


def _chunk_id(fh, n: int) -> str:
    h = ids.hasher(ids.CHUNK, all_cores=True)  # nothing else runs meanwhile
    h.update(fh.read(n))  # a file cut short while read just gets another id
    return h.hexdigest()


def _safetensors_entry(fh, relpath: str, header, chunk_bytes: int, executable: bool) -> FileEntry:
    header_id = ids.chunk_id(header.header_bytes)
    fh.seek(header.data_start)
    tensors = []
    for info in header.tensors:
        chunks = tuple(_chunk_id(fh, end - begin) for begin, end in chunk_spans(info.nbytes, info.dtype.width, chunk_bytes))
        tensors.append(TensorEntry(info.name, info.dtype.name, tuple(info.shape), chunks))
    return FileEntry.of(relpath, "safetensors", header.file_size, header=header_id, tensors=tuple(tensors),
                        executable=executable)


class StatCache:
    """path -> content hash, valid while the file's stat signature is unchanged."""

    def __init__(self, db, root: Path):
        self.db = db
        self.root = root
        self.updates: list[tuple] = []

    @staticmethod
    def signature(st: os.stat_result) -> tuple[int, int, int, int]:
        return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)

    def cached_hash(self, relpath: str, st: os.stat_result, chunk_bytes: int) -> str | None:
        row = self.db.conn.execute(
            "SELECT size, mtime_ns, ctime_ns, ino, hash, recorded_ns, chunk_bytes FROM stat_cache WHERE path = ?",
            (relpath,),
        ).fetchone()
        if row is None or tuple(row[:4]) != self.signature(st) or row[6] != chunk_bytes:
            return None
        if st.st_mtime_ns >= row[5] - RACY_MARGIN_NS:
            return None  # racy: could have changed after it was recorded
        return row[4]

    def hash(self, relpath: str, chunk_bytes: int) -> str:
        """Content id of a working-tree file for ``chunk_bytes``, from the cache when trustworthy."""
        full = self.root / relpath
        st = os.stat(full)
        cached = self.cached_hash(relpath, st, chunk_bytes)
        if cached is not None:
            return cached
        digest = content_id(full, relpath, chunk_bytes)
        self.remember(relpath, st, chunk_bytes, digest)
        return digest

    def remember(self, relpath: str, st: os.stat_result, chunk_bytes: int, digest: str) -> None:
        self.updates.append((relpath, *self.signature(st), digest, time.time_ns(), chunk_bytes))

    def flush(self, in_transaction: bool = False) -> None:
        """Write remembered entries; outside a transaction, skip silently if locked."""
        if not self.updates:
            return
        sql = ("INSERT OR REPLACE INTO stat_cache (path, size, mtime_ns, ctime_ns, ino, hash, recorded_ns,"
               " chunk_bytes) VALUES (?, ?, ?, ?, ?, ?, ?, ?)")
        if in_transaction:
            self.db.conn.executemany(sql, self.updates)
        else:
            try:
                with self.db.write():
                    self.db.conn.executemany(sql, self.updates)
            except Exception as exc:  # a busy repository only costs a re-hash next time
                log.debug("stat cache not updated (%s): files are hashed again next time", exc)
        self.updates = []

    def forget(self, relpaths) -> None:
        self.db.conn.executemany("DELETE FROM stat_cache WHERE path = ?", [(p,) for p in relpaths])
