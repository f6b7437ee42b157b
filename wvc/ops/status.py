"""Status: the working tree against HEAD, by file content hash (stat cache first)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..worktree import StatCache, scan


@dataclass
class Status:
    branch: str | None
    head: str | None
    added: list[str] = field(default_factory=list)
    modified: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    skipped_symlinks: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not (self.added or self.modified or self.deleted)

    def to_json(self):
        return {
            "branch": self.branch,
            "head": self.head,
            "clean": self.clean,
            "added": self.added,
            "modified": self.modified,
            "deleted": self.deleted,
            "skipped_symlinks": self.skipped_symlinks,
        }


def working_hashes(repo, paths) -> dict[str, str]:
    cache = StatCache(repo.db, repo.root)
    hashes = {p: cache.hash(p) for p in paths}
    cache.flush()
    return hashes


def status(repo) -> Status:
    head = repo.refs.head_commit()
    tracked = repo.read_tree(repo.read_commit(head).tree).by_path() if head else {}
    result = scan(repo.root)
    out = Status(repo.refs.head_branch(), head, skipped_symlinks=result.skipped_symlinks)
    hashes = working_hashes(repo, result.files)
    for path, digest in hashes.items():
        if path not in tracked:
            out.added.append(path)
        elif tracked[path].hash != digest:
            out.modified.append(path)
    out.deleted = sorted(set(tracked) - set(hashes))
    return out
