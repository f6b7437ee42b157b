"""Refs: branches, tags and HEAD in the database, with compare-and-swap and a reflog.

Names follow git's check-ref-format rules, so a name valid here is valid on any remote
that stores refs as paths (``refs/heads/<name>``) and cannot escape that directory.
"""

from __future__ import annotations

import re
import time

from .. import ids
from ..errors import ConcurrentUpdate, InvalidRefName
from .database import Database

HEADS = "refs/heads/"
TAGS = "refs/tags/"
HEAD_KEY = "HEAD"
_BAD_CHARS = re.compile(r"[\x00-\x20\x7f~^:?*\[\\]")


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
    except UnicodeEncodeError:
        raise InvalidRefName(f"invalid {what} name: not valid UTF-8") from None
    return name


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
        return self.db.get_config(HEAD_KEY, "ref: " + HEADS + "main")

    def set_head(self, value: str, message: str) -> None:
        old = self.head()
        self.db.set_config(HEAD_KEY, value)
        self.log(HEAD_KEY, old, value, message)

    def head_branch(self) -> str | None:
        head = self.head()
        return head[len("ref: " + HEADS):] if head.startswith("ref: ") else None

    def head_commit(self) -> str | None:
        head = self.head()
        if head.startswith("ref: "):
            return self.get(head[5:])
        return head
