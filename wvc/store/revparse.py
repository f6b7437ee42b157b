"""REV syntax: a branch, tag, full or unique-prefix commit id, HEAD, ``REF@{n}`` (where REF
pointed n moves ago, from the reflog; ``@{n}`` is HEAD's), and ~N / ^ / ^N suffixes."""

from __future__ import annotations

import re
from typing import Callable

from .. import ids
from ..errors import RevisionNotFound
from .graph import CommitGraph
from .refs import HEADS, REFS, REMOTES, TAGS, Refs

_SUFFIX = re.compile(r"(~\d*|\^\d*)$")
_REFLOG = re.compile(r"^(.*)@\{(\d{1,9})\}$")
MIN_PREFIX = 4


def resolve(refs: Refs, graph: CommitGraph, rev: str) -> str:
    """The commit id that ``rev`` names in a local repository, or RevisionNotFound."""
    return resolve_with(rev, lambda root: _resolve_root(refs, graph, root, rev),
                        lambda commit: graph.read_commit(commit).parents)


def resolve_with(rev: str, root_of: Callable[[str], str], parents_of: Callable[[str], tuple]) -> str:
    """The grammar over any history: ``root_of`` names the root (a ref, an id, a prefix),
    ``parents_of`` walks ~N and ^N. A remote view (wvc.open) resolves with its catalogs."""
    if not isinstance(rev, str) or not rev or len(rev) > 1024:
        raise RevisionNotFound("empty or oversized revision")
    steps = []
    root = rev
    while (m := _SUFFIX.search(root)) and m.start() > 0:
        steps.append(m.group(0))
        root = root[: m.start()]
    commit = root_of(root)
    for step in reversed(steps):
        n = int(step[1:] or 1)
        if step[0] == "~":
            for _ in range(n):
                commit = _parent(parents_of, commit, 1, rev)
        else:
            commit = _parent(parents_of, commit, n, rev) if n else commit
    return commit


def match_prefix(prefix: str, candidates) -> str | None:
    """The one id among ``candidates`` that starts with ``prefix`` (a hex prefix of at least
    MIN_PREFIX digits); None when ``prefix`` is no such prefix or nothing matches."""
    if not (re.fullmatch(r"[0-9a-f]+", prefix) and MIN_PREFIX <= len(prefix) <= ids.ID_HEX_LEN):
        return None
    matches = [c for c in candidates if c.startswith(prefix)][:2]
    if len(matches) > 1:
        raise RevisionNotFound(f"revision {prefix!r} is ambiguous")
    return matches[0] if matches else None


def _parent(parents_of, commit: str, n: int, rev: str) -> str:
    parents = parents_of(commit)
    if len(parents) < n:
        raise RevisionNotFound(f"revision {rev!r} goes past the start of history")
    return parents[n - 1]


def _resolve_root(refs: Refs, graph: CommitGraph, root: str, rev: str) -> str:
    if m := _REFLOG.match(root):
        return _from_reflog(refs, m.group(1) or "HEAD", int(m.group(2)), rev)
    if root == "HEAD":
        head = refs.head_commit()
        if head is None:
            raise RevisionNotFound("HEAD has no commits yet")
        return head
    for prefix in (HEADS, TAGS, REMOTES, ""):  # "": a full ref name (refs/heads/main)
        target = refs.get(prefix + root) if prefix or root.startswith(REFS) else None
        if target is not None:
            return target
    if re.fullmatch(r"[0-9a-f]+", root) and MIN_PREFIX <= len(root) <= ids.ID_HEX_LEN:
        matches = graph.with_prefix(root)
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            raise RevisionNotFound(f"revision {root!r} is ambiguous")
    raise RevisionNotFound(f"unknown revision {rev!r}")


def _from_reflog(refs: Refs, name: str, n: int, rev: str) -> str:
    entries = refs.reflog(refs.reflog_name(name), n + 1)
    if len(entries) <= n or entries[n].new is None:
        raise RevisionNotFound(f"{rev!r}: the reflog of {name} has only {len(entries)} entries"
                               if len(entries) <= n else f"{rev!r}: {name} was deleted at that point")
    return entries[n].new
