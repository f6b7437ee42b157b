"""Branches and tags: named refs created, listed and deleted."""

from __future__ import annotations

from ..errors import BranchInUse, RefExists, RevisionNotFound
from ..store.refs import HEADS, TAGS, check_ref_name


def create_ref(repo, prefix: str, name: str, start: str, what: str) -> str:
    check_ref_name(name, what)
    target = repo.resolve(start)
    with repo.db.write():
        if repo.refs.get(prefix + name) is not None:
            raise RefExists(f"{what} {name!r} already exists")
        repo.refs.set(prefix + name, target, None, f"{what}: created from {start}")
    return target


def force_branch(repo, name: str, start: str) -> tuple[str | None, str]:
    """``branch -f NAME START``: create NAME or move it to START; (old target, new target).
    The current branch is refused (``reset`` moves it together with the working tree)."""
    check_ref_name(name)
    if repo.refs.head_branch() == name:
        raise BranchInUse(f"cannot force-update branch {name!r}: it is checked out (use `wvc reset`)")
    target = repo.resolve(start)
    with repo.db.write():
        old = repo.refs.get(HEADS + name)
        repo.refs.set(HEADS + name, target, old, f"branch: reset to {start}")
    return old, target


def delete_branch(repo, name: str, force: bool = False) -> str:
    """Delete a branch; one whose commits HEAD does not contain is refused unless ``force``
    (they would be reachable from nothing but the reflog)."""
    if repo.refs.head_branch() == name:
        raise BranchInUse(f"cannot delete branch {name!r}: it is checked out")
    target = repo.refs.get(HEADS + name)
    head = repo.refs.head_commit()
    if target is not None and not force and not (head is not None and repo.graph.is_ancestor(target, head)):
        raise BranchInUse(f"branch {name!r} is not merged into HEAD: its commits would be lost "
                       f"(`wvc branch -D {name}` deletes it anyway; the reflog keeps {target[:12]} for a while)")
    return _delete(repo, HEADS, name, "branch")


def delete_tag(repo, name: str) -> str:
    return _delete(repo, TAGS, name, "tag")


def _delete(repo, prefix: str, name: str, what: str) -> str:
    with repo.db.write():
        target = repo.refs.get(prefix + name)
        if target is None:
            raise RevisionNotFound(f"no {what} named {name!r}")
        repo.refs.delete(prefix + name, f"{what}: deleted")
    return target


def rename_branch(repo, old: str, new: str) -> str:
    """``branch -m OLD NEW``: the branch keeps its commit; HEAD follows it when it was on it."""
    check_ref_name(new)
    with repo.db.write():
        target = repo.refs.get(HEADS + old)
        if target is None:
            raise RevisionNotFound(f"no branch named {old!r}")
        if repo.refs.get(HEADS + new) is not None:
            raise RefExists(f"branch {new!r} already exists")
        on_it = repo.refs.head_branch() == old
        repo.refs.set(HEADS + new, target, None, f"branch: renamed {old} to {new}")
        if on_it:
            repo.refs.set_head("ref: " + HEADS + new, f"branch: renamed {old} to {new}")
        repo.refs.delete(HEADS + old, f"branch: renamed to {new}")
    return target
