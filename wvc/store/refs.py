"""Refs: branches, tags and HEAD in the database, with compare-and-swap and a reflog.

Names follow git's check-ref-format rules, so a name valid here is valid on any remote
that stores refs as paths (``refs/heads/<name>``) and cannot escape that directory.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from .. import ids
from ..errors import ConcurrentUpdate, InvalidRefName
from . import config_keys
from .database import Database

REFS = "refs/"  # every ref (a remote keeps its refs under the same names: remotes/layout.py)
HEADS = REFS + "heads/"
TAGS = REFS + "tags/"
REMOTES = REFS + "remotes/"  # refs/remotes/<remote>/<branch>: remote-tracking branches
_BAD_CHARS = re.compile(r"[\x00-\x20\x7f~^:?*\[\\]")


def short_ref(ref: str) -> str:
    """A ref as people name it: ``main`` for a branch, ``tags/v1`` for a tag, ``remotes/origin/main``."""
    return ref.removeprefix(REFS).removeprefix("heads/")


def check_ref_name(name: str, what: str = "branch") -> str:
    problem = None
    if not name:
        problem = "is empty"
    elif len(name.encode("utf-8", "surrogatepass")) > 200:
        problem = "is longer than 200 bytes"
    elif _BAD_CHARS.search(name):
        problem = "contains a space, control character or one of ~^:?*[\\"
    elif name.startswith(("-", "/")) or name.endswith(("/", ".", ".lock")):
        problem = "starts with - or /, or ends with /, . or .lock"
    elif ".." in name or "//" in name or "@{" in name or name == "@":
        problem = "contains .., //, @{ or is @"
    elif any(part.startswith(".") for part in name.split("/")):
        problem = "has a component starting with ."
    elif name == "HEAD" or ids.is_object_id(name):
        problem = "is reserved"
    if problem:
        raise InvalidRefName(f"invalid {what} name {name!r}: it {problem}")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidRefName(f"invalid {what} name: not valid UTF-8") from exc
    return name


@dataclass(frozen=True)
class ReflogEntry:
    seq: int
    old: str | None
    new: str | None  # None: the ref was deleted
    time: int
    message: str

    def to_json(self):
        return {"old": self.old, "new": self.new, "time": self.time, "message": self.message}


class Refs:
    def __init__(self, db: Database):
        self.db = db

    def get(self, ref: str) -> str | None:
        return self.db.one("SELECT target FROM refs WHERE name = ?", (ref,))

    def list(self, prefix: str) -> dict[str, str]:
        rows = self.db.query("SELECT name, target FROM refs WHERE name LIKE ? ORDER BY name", (prefix + "%",))
        return {name[len(prefix):]: target for name, target in rows if name.startswith(prefix)}

    def set(self, ref: str, new: str, expected: str | None, message: str) -> None:
        """Move ``ref`` to ``new`` if it still points at ``expected`` (None: must not exist).

        Call inside a write transaction; the check and the move are then atomic.
        """
        current = self.get(ref)
        if current != expected:
            raise ConcurrentUpdate(
                f"{ref} moved to {ids.short(current or 'nothing')} while this operation ran; retry it"
            )
        self.db.conn.execute("INSERT OR REPLACE INTO refs VALUES (?, ?)", (ref, new))
        self.log(ref, current, new, message)
        if ref == self.head()[len("ref: "):] and current != new:  # HEAD moved with its branch
            self.log(config_keys.HEAD, current, new, message)

    def delete(self, ref: str, message: str) -> None:
        current = self.get(ref)
        self.db.conn.execute("DELETE FROM refs WHERE name = ?", (ref,))
        self.log(ref, current, None, message)

    def log(self, ref: str, old: str | None, new: str | None, message: str) -> None:
        self.db.conn.execute(
            "INSERT INTO reflog (ref, old, new, time, message) VALUES (?, ?, ?, ?, ?)",
            (ref, old, new, int(time.time()), message),
        )

    # HEAD is either "ref: refs/heads/<branch>" or a commit id (detached).
    def head(self) -> str:
        return self.db.get_config(config_keys.HEAD, "ref: " + HEADS + "main")

    def set_head(self, value: str, message: str) -> None:
        """Point HEAD at a branch ("ref: refs/heads/x") or a commit. HEAD's reflog records
        the commits it named before and after, as git's does (switching to a branch at the
        same commit is recorded too: `checkout: moving to x`)."""
        old = self.head_commit()
        self.db.set_config(config_keys.HEAD, value)
        self.log(config_keys.HEAD, old, self.head_commit(), message)

    def reflog_name(self, name: str) -> str:
        """The full ref whose reflog ``name`` means: HEAD, a full ref name, else the branch,
        tag or remote-tracking ref of that name (a deleted branch's: refs/heads/NAME)."""
        if name == config_keys.HEAD or name.startswith(REFS):
            return name
        return next((p + name for p in (HEADS, TAGS, REMOTES) if self.get(p + name) is not None),
                    HEADS + name)

    def reflog(self, ref: str, limit: int | None = None) -> list[ReflogEntry]:
        """``ref``'s recorded moves, newest first (entry 0 is where it points now). Entries
        an older wvc wrote for HEAD ("ref: ..." values) are left out."""
        rows = self.db.query("SELECT seq, old, new, time, message FROM reflog WHERE ref = ? ORDER BY seq DESC"
                             + (" LIMIT ?" if limit is not None else ""),
                             (ref, limit) if limit is not None else (ref,))
        return [ReflogEntry(*row) for row in rows
                if (row[2] is None or ids.is_object_id(row[2])) and (row[1] is None or ids.is_object_id(row[1]))]

    def reflog_commits(self, since: int) -> set[str]:
        """Every commit a reflog entry at or after ``since`` (unix time) names."""
        rows = self.db.query("SELECT old, new FROM reflog WHERE time >= ?", (since,))
        return {c for row in rows for c in row if c is not None and ids.is_object_id(c)}

    def expire_reflog(self, before: int) -> int:
        """Drop entries older than ``before``; in a write transaction."""
        return self.db.conn.execute("DELETE FROM reflog WHERE time < ?", (before,)).rowcount

    def head_branch(self) -> str | None:
        head = self.head()
        return head[len("ref: " + HEADS):] if head.startswith("ref: ") else None

    def head_commit(self) -> str | None:
        head = self.head()
        if head.startswith("ref: "):
            return self.get(head[5:])
        return head
