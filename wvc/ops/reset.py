"""Reset: move the current branch (or a detached HEAD) to another commit.

``soft`` moves the ref only; ``mixed`` is the same in wvc (there is no staging area to
reset); ``hard`` also makes the working tree hold the commit, local changes discarded.
The old position stays in the reflog (``wvc reflog``, ``main@{1}``) and gc keeps the
commits it names for REFLOG_EXPIRE_SECONDS, so a reset is undone with ``wvc reset main@{1}``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..progress import NULL, Progress
from ..store.refs import HEADS
from .checkout import switch_worktree

MODES = ("soft", "mixed", "hard")


@dataclass(frozen=True)
class ResetResult:
    mode: str
    branch: str | None
    old: str | None
    new: str
    written: int
    removed: int

    def to_json(self):
        return dict(self.__dict__)


def reset(repo, rev: str, *, mode: str = "mixed", progress: Progress = NULL) -> ResetResult:
    if mode not in MODES:
        from ..errors import InvalidArgument

        raise InvalidArgument(f"reset mode {mode!r}: use soft, mixed or hard")
    with repo.worktree_lock("reset"):
        new = repo.resolve(rev)
        old = repo.refs.head_commit()
        branch = repo.refs.head_branch()
        written = removed = 0
        if mode == "hard":
            current = repo.tree_of(old) if old else None
            written, removed = switch_worktree(repo, current, repo.tree_of(new), force=True, progress=progress)
        with repo.db.write():
            message = f"reset: moving to {rev}"
            if branch is not None:
                repo.refs.set(HEADS + branch, new, old, message)  # CAS against what we read
            else:
                repo.refs.set_head(new, message)
    return ResetResult(mode, branch, old, new, written, removed)
