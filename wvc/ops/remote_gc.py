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
    cut = Cut.of(contents.live_segments, live_commits, live_trees, live_objects)
    result = RemoteGcResult(remote_name, dry_run, len(contents.live_segments), len(cut.dead), len(cut.partial),
                            cut.objects_removed, cut.commits_removed, cut.bytes_freed)
    rewriting = bool(cut.dead or cut.partial)
    # followers' step records (remotes/step_records.py) of commits no ref reaches, or naming packs
    # this rewrite replaces: shortcuts that no longer lead anywhere, deleted (not retired)
    stale = [p for c, p in remote.step_records().items() if rewriting or c not in live_commits]
    if dry_run:
        return result
    if rewriting:  # (the stale records go with the rewrite: in its commit on the Hub, elsewhere right after)
        with tempfile.TemporaryDirectory(prefix="wvc-remote-gc-", dir=repo.wvc_dir) as tmp:
            remote.rewrite(cut.dead + cut.partial, cut.kept(live_objects, live_commits, live_trees),
                           f"wvc gc: {cut.objects_removed} objects, {cut.commits_removed} commits removed", Path(tmp),
                           progress, step_records=stale)
    else:
        remote.delete_step_records(stale)
    return result


@dataclass
class Cut:
    """Which live segments lose what: removed whole (``dead``) or rewritten with what stays
    (``partial``). Shared by ``gc --remote`` and ``prune --remote``."""
    dead: list
    partial: list
    objects_removed: int
    commits_removed: int
    bytes_freed: int  # pack bytes of the objects removed
    bytes_left: int = 0  # pack bytes of dead objects left where they are (``min_dead_share``)

    @classmethod
    def of(cls, segments, live_commits: set[str], live_trees: set[str], live_objects: set[str], *,
           min_dead_share: float = 0.0, replaced: set[str] = frozenset()) -> "Cut":
        """``min_dead_share``: a segment that keeps live objects is rewritten only once at
        least this share of its object bytes is dead; below it, its dead objects stay (the
        catalog still lists them; no ref reaches them) until a later cut frees enough.
        ``replaced``: live objects whose payloads here go, a new segment holding them
        (remotes/rebase_plan.py): every segment holding one is cut, whatever its dead share."""
        cut = cls([], [], 0, 0, 0)
        for seg in segments:  # retired ones are on their way out already
            dead_entries = [e for e in seg.entries if e.id not in live_objects or e.id in replaced]
            dead_commits = [c for c in seg.commits if c not in live_commits]
            if not dead_entries and not dead_commits and not [t for t in seg.trees if t not in live_trees]:
                continue
            dead_bytes = sum(e.length for e in dead_entries)
            alive = len(seg.entries) - len(dead_entries) + len(seg.commits) - len(dead_commits)
            if alive and not dead_commits and dead_bytes < min_dead_share * sum(e.length for e in seg.entries) \
                    and not any(e.id in replaced for e in dead_entries):
                cut.bytes_left += dead_bytes
                continue
            cut.objects_removed += len(dead_entries)
            cut.commits_removed += len(dead_commits)
            cut.bytes_freed += dead_bytes
            (cut.partial if alive else cut.dead).append(seg)
        return cut

    def kept(self, live_objects, live_commits, live_trees) -> list:
        return [seg.only(live_objects, live_commits, live_trees) for seg in self.partial]
