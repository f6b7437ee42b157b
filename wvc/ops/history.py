"""History: log (with an ASCII graph) and show."""

from __future__ import annotations

from dataclasses import dataclass

from ..store.refs import HEADS, TAGS


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
        }


def ref_labels(repo) -> dict[str, list[str]]:
    labels: dict[str, list[str]] = {}
    branch = repo.refs.head_branch()
    head = repo.refs.head_commit()
    if head and branch is None:
        labels.setdefault(head, []).append("HEAD")
    for name, target in repo.refs.list(HEADS).items():
        labels.setdefault(target, []).append(f"HEAD -> {name}" if name == branch else name)
    for name, target in repo.refs.list("refs/remotes/").items():
        labels.setdefault(target, []).append(name)
    for name, target in repo.refs.list(TAGS).items():
        labels.setdefault(target, []).append(f"tag: {name}")
    return labels


def log(repo, rev: str = "HEAD", n: int | None = None, all_refs: bool = False) -> list[LogEntry]:
    """Commits reachable from ``rev`` (or every ref), newest first, each parent after its children."""
    if all_refs:
        starts = set(repo.refs.list("refs/").values())  # branches, tags and remote-tracking refs
        if head := repo.refs.head_commit():
            starts.add(head)
    else:
        if rev == "HEAD" and repo.refs.head_commit() is None:
            return []
        starts = {repo.resolve(rev)}
    labels = ref_labels(repo)
    out = []
    for cid in repo.graph.newest_first(starts, n):
        c = repo.read_commit(cid)
        out.append(LogEntry(cid, c.parents, c.author, c.timestamp, c.message, c.metadata,
                            repo.graph.stored_bytes(cid), tuple(labels.get(cid, ()))))
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
            lanes.extend(p for p in e.parents[1:] if p not in lanes)
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
