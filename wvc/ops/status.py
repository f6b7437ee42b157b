"""Status: the working tree against HEAD, by file content id (stat cache first)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..worktree.scan import StatCache, scan


@dataclass
class Status:
    branch: str | None
    head: str | None
    added: list[str] = field(default_factory=list)
    modified: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    skipped_symlinks: list[str] = field(default_factory=list)
    linked_files: list[str] = field(default_factory=list)
    nested_repositories: list[str] = field(default_factory=list)
    bad_names: list[tuple[str, str]] = field(default_factory=list)

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
            "linked_files": self.linked_files,
            "nested_repositories": self.nested_repositories,
            "bad_names": [{"path": p, "problem": why} for p, why in self.bad_names],
        }


def working_hashes(repo, paths, chunk_bytes: int) -> dict[str, str]:
    """Content ids of working files as a tree with ``chunk_bytes`` records them."""
    cache = StatCache(repo.db, repo.root)
    hashes = {p: cache.hash(p, chunk_bytes) for p in paths}
    cache.flush()
    return hashes


def status(repo) -> Status:
    head = repo.refs.head_commit()
    tree = repo.read_tree(repo.read_commit(head).tree) if head else None
    tracked = tree.by_path() if tree else {}
    result = scan(repo.root)
    out = Status(repo.refs.head_branch(), head, skipped_symlinks=result.skipped_symlinks,
                 linked_files=result.linked_files, nested_repositories=result.nested_repositories,
                 bad_names=result.bad_names)
    hashes = working_hashes(repo, result.files, tree.chunk_bytes if tree else repo.chunk_bytes)
    for path, digest in hashes.items():
        if path not in tracked:
            out.added.append(path)
        elif tracked[path].content_id != digest:
            out.modified.append(path)
    out.deleted = sorted(set(tracked) - set(hashes))
    return out
