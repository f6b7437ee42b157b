"""``wvc gc --remote NAME``: remove from a remote what none of its refs reaches.

The remote's catalogs (and format-1 files) give its graph; from every ref, the commits,
their trees, the chunks and the delta bases those need are live. A segment with nothing
live is removed; one with some dead objects is rewritten with the live ones (its pack
downloaded, checked, the live payloads copied). The result is published like a push:
refs unchanged, compare-and-swap against the state read at the start (a push in between
makes it retry), replaced files deleted in the same Hub commit, or retired and deleted
after the grace period elsewhere (compaction.py re-checks reachability before deleting,
so a push racing the gc never loses an object). ``dry_run`` reports and changes nothing.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import RemoteError
from ..progress import NULL, Progress
from .remote_config import open_remote_repository


@dataclass
class RemoteGcResult:
    remote: str
    dry_run: bool
    segments_before: int
    segments_removed: int
    segments_rewritten: int
    objects_removed: int
    commits_removed: int
    bytes_freed: int  # pack bytes of the objects removed

    def to_json(self):
        return dict(self.__dict__)


def remote_gc(repo, remote_name: str, *, dry_run: bool = False, progress: Progress = NULL) -> RemoteGcResult:
    remote = open_remote_repository(repo, remote_name)
    contents = remote.contents
    try:
        live_commits, live_trees, live_objects = remote.reachable()
    except RemoteError as exc:
        raise RemoteError(f"{exc}: refusing to collect garbage on {remote_name}") from exc
    dead, partial = [], []
    objects_removed = commits_removed = bytes_freed = 0
    for seg in contents.live_segments:  # retired ones are on their way out already
        dead_entries = [e for e in seg.entries if e.id not in live_objects]
        dead_commits = [c for c in seg.commits if c not in live_commits]
        if not dead_entries and not dead_commits and not [t for t in seg.trees if t not in live_trees]:
            continue
        objects_removed += len(dead_entries)
        commits_removed += len(dead_commits)
        bytes_freed += sum(e.length for e in dead_entries)
        alive = len(seg.entries) - len(dead_entries) + len(seg.commits) - len(dead_commits)
        (partial if alive else dead).append(seg)
    result = RemoteGcResult(remote_name, dry_run, len(contents.live_segments), len(dead), len(partial), objects_removed,
                            commits_removed, bytes_freed)
    if dry_run or not (dead or partial):
        return result
    with tempfile.TemporaryDirectory(prefix="wvc-remote-gc-", dir=repo.wvc_dir) as tmp:
        remote.rewrite(dead + partial, [seg.only(live_objects, live_commits, live_trees) for seg in partial],
                       f"wvc gc: {objects_removed} objects, {commits_removed} commits removed", Path(tmp), progress)
    return result
