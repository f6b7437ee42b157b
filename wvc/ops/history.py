"""History: log (with an ASCII graph) and show."""

from __future__ import annotations

from dataclasses import dataclass

from ..fsutil import selected
from ..store.refs import HEADS, REFS, REMOTES, TAGS


@dataclass(frozen=True)
class LogEntry:
    id: str
    parents: tuple[str, ...]
    author: str
    timestamp: int
    message: str
    metadata: dict
    stored_bytes: int | None
    refs: tuple[str, ...]
    pruned: bool = False  # its weights were dropped by `wvc prune` (ops/prune.py)

    def to_json(self):
        return {
            "commit": self.id,
            "parents": list(self.parents),
            "author": self.author,
            "timestamp": self.timestamp,
            "message": self.message,
            "metadata": self.metadata,
            "stored_bytes": self.stored_bytes,
            "refs": list(self.refs),
            "pruned": self.pruned,
        }


def ref_labels(repo) -> dict[str, list[str]]:
    labels: dict[str, list[str]] = {}
    branch = repo.refs.head_branch()
    head = repo.refs.head_commit()
    if head and branch is None:
        labels.setdefault(head, []).append("HEAD")
    for name, target in repo.refs.list(HEADS).items():
        labels.setdefault(target, []).append(f"HEAD -> {name}" if name == branch else name)
    for name, target in repo.refs.list(REMOTES).items():
        labels.setdefault(target, []).append(name)
    for name, target in repo.refs.list(TAGS).items():
        labels.setdefault(target, []).append(f"tag: {name}")
    return labels


def log(repo, rev: str = "HEAD", n: int | None = None, all_refs: bool = False, *, exclude=(),
        paths=()) -> list[LogEntry]:
    """Commits reachable from ``rev`` (or every ref), newest first, each parent after its children.

    ``rev`` may be ``A..B`` (reachable from B, not from A, as in git); ``exclude`` REVs
    (git's ``^REV``) and their ancestors are left out; ``paths``: only commits that changed
    a file at or under one of them against their first parent (git's ``log -- PATH``)."""
    if ".." in rev and not all_refs:
        a, _, b = rev.partition("..")
        rev, exclude = b or "HEAD", (*exclude, a or "HEAD")
    if all_refs:
        starts = set(repo.refs.list(REFS).values())  # branches, tags and remote-tracking refs
        if head := repo.refs.head_commit():
            starts.add(head)
    else:
        if rev == "HEAD" and repo.refs.head_commit() is None:
            return []
        starts = {repo.resolve(rev)}
    hidden: set[str] = set()
    if exclude:
        tips = [repo.resolve(r) for r in exclude]
        hidden = set(repo.graph.ancestors(tips)) | set(tips)
    labels = ref_labels(repo)
    pruned = repo.graph.pruned()
    out = []
    for cid in repo.graph.newest_first(starts, None if (hidden or paths) else n):
        if n is not None and len(out) >= n:
            break
        if cid in hidden or (paths and not _touches(repo, cid, paths)):
            continue
        c = repo.read_commit(cid)
        out.append(LogEntry(cid, c.parents, c.author, c.timestamp, c.message, c.metadata,
                            repo.graph.stored_bytes(cid), tuple(labels.get(cid, ())), cid in pruned))
    return out


def _touches(repo, cid: str, paths) -> bool:
    """Whether commit ``cid`` changed a file at or under one of ``paths`` against its first parent."""
    return any(selected(f["path"], paths) for f in changed_files(repo, cid))


def changed_files(repo, cid: str) -> list[dict]:
    """What commit ``cid`` changed against its first parent: path, status, sizes (``--stat``)."""
    commit = repo.read_commit(cid)
    mine = repo.read_tree(commit.tree).by_path()
    before = repo.read_tree(repo.read_commit(commit.parents[0]).tree).by_path() if commit.parents else {}
    out = []
    for path in sorted(set(mine) | set(before)):
        a, b = before.get(path), mine.get(path)
        if a is not None and b is not None and a.content_id == b.content_id:
            continue
        status = "added" if a is None else "deleted" if b is None else "modified"
        out.append({"path": path, "status": status, "size_a": a.size if a else None, "size_b": b.size if b else None})
    return out


def reflog(repo, ref: str = "HEAD", n: int | None = None) -> list[dict]:
    """``ref``'s reflog, newest first, each entry with its ``REF@{i}`` name."""
    from ..errors import RevisionNotFound

    full = repo.refs.reflog_name(ref)
    if full != "HEAD" and repo.refs.get(full) is None and not repo.refs.reflog(full, 1):
        raise RevisionNotFound(f"no reflog for {ref!r}")
    return [{"selector": f"{ref}@{{{i}}}", **e.to_json()} for i, e in enumerate(repo.refs.reflog(full, n))]


def graph_lines(entries: list[LogEntry]) -> list[tuple[str, LogEntry | None]]:
    """Lane markers for each entry, git-style; a ``None`` entry is a connector line.

    ``lanes`` holds, per column, the commit that column is waiting for. Two branches
    forked from one commit both wait for it; when it comes, the extra columns close
    with a ``/`` connector.
    """
    lanes: list[str] = []
    out: list[tuple[str, LogEntry | None]] = []
    for e in entries:
        if e.id not in lanes:
            lanes.append(e.id)
        col = lanes.index(e.id)
        closing = [i for i, lane in enumerate(lanes) if lane == e.id and i != col]
        if closing:
            out.append((" ".join("/" if i in closing else "|" for i in range(len(lanes))).replace(" /", "/"), None))
            for i in reversed(closing):
                del lanes[i]
        out.append((" ".join("*" if i == col else "|" for i in range(len(lanes))), e))
        if e.parents:
            lanes[col] = e.parents[0]
            opened = [p for p in dict.fromkeys(e.parents[1:]) if p not in lanes]
            if opened:  # a merge's other parents fork off to the right: draw where each lane starts
                out.append((" ".join(["|"] * len(lanes) + ["\\"] * len(opened)).replace(" \\", "\\"), None))
            lanes.extend(opened)
        else:
            del lanes[col]
    return out


def show(repo, rev: str = "HEAD") -> dict:
    cid = repo.resolve(rev)
    c = repo.read_commit(cid)
    tree = repo.read_tree(c.tree)
    stored = repo.graph.stored_bytes(cid)
    return {
        "commit": cid,
        "tree": c.tree,
        "parents": list(c.parents),
        "author": c.author,
        "timestamp": c.timestamp,
        "message": c.message,
        "metadata": c.metadata,
        "logical_bytes": tree.logical_bytes,
        "stored_bytes": stored,
        "files": [
            {"path": f.path, "kind": f.kind, "size": f.size, "tensors": len(f.tensors)} for f in tree.files
        ],
    }
