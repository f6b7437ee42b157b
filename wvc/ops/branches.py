"""Branches and tags: named refs created, listed and deleted."""

from __future__ import annotations

from ..errors import RefExists, RevisionNotFound, WvcError
from ..store.refs import HEADS, TAGS, check_ref_name


def create_ref(repo, prefix: str, name: str, start: str, what: str) -> str:
    check_ref_name(name, what)
    target = repo.resolve(start)
    with repo.db.write():
        if repo.refs.get(prefix + name) is not None:
            raise RefExists(f"{what} {name!r} already exists")
        repo.refs.set(prefix + name, target, None, f"{what}: created from {start}")
    return target


def delete_branch(repo, name: str) -> str:
    if repo.refs.head_branch() == name:
        raise WvcError(f"cannot delete branch {name!r}: it is checked out")
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
