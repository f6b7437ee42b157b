"""Partial (lazy) clones: commits and trees now, chunk objects on first use.

``wvc clone --lazy`` records ``lazy.remote`` and fetches only commits and trees (a few KB
per version). Whatever later needs chunks the repository lacks (checkout, load_state_dict,
a commit's delta bases, a push to another remote) asks :func:`fetch_objects` for them:
each missing chunk and the delta bases it needs are found in the remote's pack indexes
and read with range requests (neighbouring objects of one pack coalesced into one
request), written into a new local pack, verified object by object exactly like a fetch,
and recorded in one transaction. A checkout of one version downloads that version only.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from .. import ids
from ..fsutil import fsync_dir
from ..progress import NULL, Progress
from ..remotes.base import RemoteError, pack_path
from ..store.packs import PackWriter, pack_filename

COALESCE_GAP = 256 << 10  # read through gaps up to this size rather than open another request
MAX_REQUEST = 64 << 20


def lazy_remote(repo) -> str | None:
    """The remote objects are fetched from on first use, if this is a lazy clone."""
    return repo.db.get_config("lazy.remote")


def _spans(entries):
    """Group pack entries sorted by offset into ranges worth one request each."""
    span = []
    for e in entries:
        if span and (e.offset - (span[-1].offset + span[-1].length) > COALESCE_GAP
                     or e.offset + e.length - span[0].offset > MAX_REQUEST):
            yield span
            span = []
        span.append(e)
    if span:
        yield span


def fetch_objects(repo, object_ids, progress: Progress = NULL) -> int:
    """Make ``object_ids`` (and their delta bases) local; returns the bytes downloaded."""
    from .sync import open_remote_named, remote_index, verify_packs

    remote_name = lazy_remote(repo)
    missing = [o for o in dict.fromkeys(object_ids) if not repo.store.has(o)]
    if remote_name is None or not missing:
        return 0
    remote = open_remote_named(repo, remote_name)
    state = remote.state()
    index = {}
    for name in state.packs:
        for entry in remote_index(repo, remote, name):
            index.setdefault(entry.id, (name, entry))
    wanted: dict[str, tuple] = {}
    stack = list(missing)
    while stack:
        oid = stack.pop()
        if oid in wanted or repo.store.has(oid):
            continue
        found = index.get(oid)
        if found is None:
            raise RemoteError(f"object {ids.short(oid)} is neither local nor on remote {remote_name} "
                              f"(this is a lazy clone of it)")
        wanted[oid] = found
        if found[1].base:
            stack.append(found[1].base)

    by_pack: dict[str, list] = {}
    for name, entry in wanted.values():
        by_pack.setdefault(name, []).append(entry)
    tmp = Path(tempfile.mkdtemp(prefix="wvc-lazy-", dir=repo.wvc_dir))
    try:
        writer = PackWriter(tmp)
        progress.start(sum(e.length for e in (x[1] for x in wanted.values())), "fetching objects")
        for name, entries in sorted(by_pack.items()):
            for span in _spans(sorted(entries, key=lambda e: e.offset)):
                start = span[0].offset
                data = remote.read_range(pack_path(name), start, span[-1].offset + span[-1].length - start)
                for e in span:
                    payload = data[e.offset - start : e.offset - start + e.length]
                    writer.add(e.id, payload, e.raw_size, e.method, e.base)
                    progress.advance(e.length)
        progress.close()
        name, size = writer.finish()
        staged = tmp / pack_filename(name)
        (rows,) = verify_packs(repo, [(name, staged)])  # every object decoded and hash-checked
        os.replace(staged, repo.store.packs_dir / pack_filename(name))
        fsync_dir(repo.store.packs_dir)
        with repo.db.write():
            repo.store.insert_rows((name, size), rows)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return remote.bytes_downloaded
