"""Per-commit tensor changes, kept: each tensor's change against the commit's first parent
(elements changed, largest change in value and in units of last place, relative L2, bytes
stored), computed once (ops/changes.py) and read by `wvc ui` and `wvc plot` without
decoding the history again. A tensor whose chunks did not change has no row."""

from __future__ import annotations

from dataclasses import dataclass

from .database import Database

FIELDS = ("file", "tensor", "status", "numel", "changed", "max_abs_delta", "max_ulps", "rel_l2", "stored_bytes")


@dataclass(frozen=True)
class TensorChange:
    file: str
    tensor: str
    status: str  # "modified" | "added" | "removed" | "reshaped" | "retyped" (ops/diff.py)
    numel: int
    changed: int | None
    max_abs_delta: float | None
    max_ulps: int | None
    rel_l2: float | None
    stored_bytes: int | None

    def to_json(self) -> dict:
        return dict(self.__dict__)


class ChangeStats:
    def __init__(self, db: Database):
        self.db = db

    def done(self, commit_ids) -> set[str]:
        """Those of ``commit_ids`` whose changes are kept."""
        wanted = list(dict.fromkeys(commit_ids))
        out: set[str] = set()
        for k in range(0, len(wanted), 500):
            batch = wanted[k : k + 500]
            out.update(r[0] for r in self.db.query(
                f"SELECT commit_id FROM changes_done WHERE commit_id IN ({','.join('?' * len(batch))})", batch))
        return out

    def put(self, commit_id: str, parent: str | None, changes: list[TensorChange]) -> None:
        """Keep one commit's changes (inside the caller's transaction)."""
        self.db.conn.execute("DELETE FROM tensor_changes WHERE commit_id = ?", (commit_id,))
        self.db.conn.executemany(
            f"INSERT INTO tensor_changes VALUES (?, ?, {', '.join('?' * len(FIELDS))})",
            [(commit_id, parent, *(getattr(c, f) for f in FIELDS)) for c in changes])
        self.db.conn.execute("INSERT OR REPLACE INTO changes_done VALUES (?, ?)", (commit_id, parent))

    def get(self, commit_id: str) -> list[TensorChange]:
        rows = self.db.query(f"SELECT {', '.join(FIELDS)} FROM tensor_changes WHERE commit_id = ? "
                             "ORDER BY file, tensor", (commit_id,))
        return [TensorChange(*r) for r in rows]
