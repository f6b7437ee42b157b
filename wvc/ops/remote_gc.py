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
from ..remotes import compaction
from ..remotes.catalog import Catalog, catalog_name, catalog_path
from ..remotes.interface import pack_path
from ..remotes.transfer import Segment, remote_contents
from .remote_config import index_cache, open_remote_named


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
    remote = open_remote_named(repo, remote_name)
    state = remote.state()
    contents = remote_contents(remote, state, index_cache(repo))
    try:
        live_commits, live_trees, live_objects = contents.reachable(remote, state.refs.values())
    except RemoteError as exc:
        raise RemoteError(f"{exc}: refusing to collect garbage on {remote_name}") from None
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
        files: dict[str, Path | bytes] = {}
        if partial:
            kept = [_only_live(seg, live_objects, live_commits, live_trees) for seg in partial]
            progress.start(len(kept), "rewriting remote packs", unit="segments")
            pack_file, catalog = compaction.merge_segments(remote, kept, None, Catalog(None), Path(tmp))
            progress.close()
            if pack_file is not None:
                files[pack_path(catalog.pack)] = pack_file
            data = catalog.to_bytes()
            files[catalog_path(catalog_name(data))] = data
        retired = [f for seg in dead + partial for f in seg.files()]
        delete: tuple[str, ...] = ()
        if remote.deletes_atomically:
            delete = tuple(retired)
        else:
            path, record = compaction.retired_record(retired)
            files[path] = record
        remote.publish(files, {}, state, f"wvc gc: {objects_removed} objects, {commits_removed} commits removed",
                       delete=delete)
    return result


def _only_live(seg: Segment, objects: set[str], commits: set[str], trees: set[str]) -> Segment:
    return Segment(seg.catalog, seg.pack, [e for e in seg.entries if e.id in objects],
                   {c: d for c, d in seg.commits.items() if c in commits},
                   {t: d for t, d in seg.trees.items() if t in trees})
