"""REV syntax: a branch, tag, full or unique-prefix commit id, HEAD, and ~N / ^ / ^N suffixes."""

from __future__ import annotations

import re

from . import ids
from .errors import RevisionNotFound
from .store.graph import CommitGraph
from .store.refs import HEADS, TAGS, Refs

_SUFFIX = re.compile(r"(~\d*|\^\d*)$")
MIN_PREFIX = 4


def resolve(refs: Refs, graph: CommitGraph, rev: str) -> str:
    """The commit id that ``rev`` names, or RevisionNotFound."""
    if not isinstance(rev, str) or not rev or len(rev) > 1024:
        raise RevisionNotFound("empty or oversized revision")
    steps = []
    base = rev
    while (m := _SUFFIX.search(base)) and m.start() > 0:
        steps.append(m.group(0))
        base = base[: m.start()]
    commit = _resolve_base(refs, graph, base, rev)
    for step in reversed(steps):
        n = int(step[1:] or 1)
        if step[0] == "~":
            for _ in range(n):
                commit = _parent(graph, commit, 1, rev)
        else:
            commit = _parent(graph, commit, n, rev) if n else commit
    return commit


def _parent(graph: CommitGraph, commit: str, n: int, rev: str) -> str:
    parents = graph.read_commit(commit).parents
    if len(parents) < n:
        raise RevisionNotFound(f"revision {rev!r} goes past the start of history")
    return parents[n - 1]


def _resolve_base(refs: Refs, graph: CommitGraph, base: str, rev: str) -> str:
    if base == "HEAD":
        head = refs.head_commit()
        if head is None:
            raise RevisionNotFound("HEAD has no commits yet")
        return head
    for prefix in (HEADS, TAGS, "refs/remotes/", ""):  # "": a full ref name (refs/heads/main)
        target = refs.get(prefix + base) if prefix or base.startswith("refs/") else None
        if target is not None:
            return target
    if re.fullmatch(r"[0-9a-f]+", base) and MIN_PREFIX <= len(base) <= ids.ID_HEX_LEN:
        matches = graph.with_prefix(base)
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            raise RevisionNotFound(f"revision {base!r} is ambiguous")
    raise RevisionNotFound(f"unknown revision {rev!r}")
