"""The local cache of versions that ``snapshot_download`` materializes (and a follower's
catalogs), with what it needs to answer offline, and a way to list and prune it.

    <root>/trees/<tree id>/            a version's files (a tree id names the content)
    <root>/commits/<commit id>         the tree id of a commit that was downloaded
    <root>/revisions/<url digest>.json {"url", "revisions": {rev: commit}}: what each
                                       revision resolved to when last online
    <root>/follow/...                  a follower's immutable catalogs

The root is $WVC_CACHE, else ``wvc`` in huggingface_hub's home ($HF_HOME, default
$XDG_CACHE_HOME/huggingface or ~/.cache/huggingface): one place to find and clean what
models cost on disk.
"""

from __future__ import annotations

import logging
import json
import re
import shutil
import time
from pathlib import Path

from .. import settings
from .. import ids
from ..fsutil import atomic_write

log = logging.getLogger(__name__)

CACHE_ENV = "WVC_CACHE"


def cache_root() -> Path:
    if env := settings.text(CACHE_ENV):
        return Path(env).expanduser()
    if hf_home := settings.text("HF_HOME"):
        return Path(hf_home).expanduser() / "wvc"
    return Path(settings.text("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "huggingface" / "wvc"


def offline() -> bool:
    """huggingface_hub's switch: no network, answer from the cache or say what is missing."""
    return settings.hf_offline()


def _revisions_file(root: Path, url: str) -> Path:
    return root / "revisions" / f"{ids.cache_name(url, 32)}.json"


def remember(root: Path, url: str, rev: str, commit: str, tree: str) -> None:
    """Record that ``rev`` of ``url`` was ``commit`` (whose files are ``tree``) just now."""
    (root / "commits").mkdir(parents=True, exist_ok=True)
    atomic_write(root / "commits" / commit, tree.encode(), durable=False)
    path = _revisions_file(root, url)
    try:
        data = json.loads(path.read_text())
        revisions = data["revisions"] if isinstance(data, dict) and isinstance(data.get("revisions"), dict) else {}
    except (OSError, ValueError):
        revisions = {}
    revisions[rev] = commit
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps({"url": url, "revisions": revisions}, sort_keys=True).encode(), durable=False)


def cached_tree(root: Path, url: str, rev: str) -> Path | None:
    """The cached directory of ``rev`` of ``url`` without the network: a full commit id that
    was downloaded, or the commit the revision resolved to when last online."""
    commit = rev if ids.is_object_id(rev) else None
    if commit is None:
        try:
            commit = json.loads(_revisions_file(root, url).read_text())["revisions"].get(rev)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.debug("version cache: no usable revisions file for %s (%s): not answered offline", url, exc)
            return None
    if not isinstance(commit, str) or not ids.is_object_id(commit):
        return None
    try:
        tree = (root / "commits" / commit).read_text().strip()
    except OSError:
        return None
    target = root / "trees" / tree
    return target if ids.is_object_id(tree) and target.is_dir() else None


def entries(root: Path) -> list[dict]:
    """Every cached version: tree id, bytes, when it was made, and the url@revisions known to name it."""
    names: dict[str, list[str]] = {}
    commit_tree = {}
    for p in (root / "commits").glob("*") if (root / "commits").is_dir() else ():
        try:
            commit_tree[p.name] = p.read_text().strip()
        except OSError:
            continue
    for p in (root / "revisions").glob("*.json") if (root / "revisions").is_dir() else ():
        try:
            data = json.loads(p.read_text())
            for rev, commit in data["revisions"].items():
                if commit in commit_tree:
                    names.setdefault(commit_tree[commit], []).append(f"{data['url']}@{rev}")
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.debug("version cache: skipped an unreadable revisions file (%s)", exc)
            continue
    out = []
    for d in sorted((root / "trees").iterdir()) if (root / "trees").is_dir() else ():
        # wvc writes each version as a real directory; a link in its place is not one of
        # them (prune would not remove it, and its target is not the cache's to count)
        if d.is_symlink() or not d.is_dir() or not re.fullmatch(r"[0-9a-f]{64}", d.name):
            continue
        size = _bytes_under(d)
        out.append({"tree": d.name, "bytes": size, "created": int(d.stat().st_mtime),
                    "names": sorted(names.get(d.name, []))})
    return out


def _bytes_under(directory: Path) -> int:
    """The bytes of the regular files under ``directory``, links not followed."""
    import os
    import stat

    total = 0
    for dirpath, _, filenames in os.walk(directory):  # (followlinks=False)
        for name in filenames:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
    return total


def prune(root: Path, *, older_than_days: float | None = None, everything: bool = False,
          dry_run: bool = False) -> dict:
    """Remove cached versions made more than ``older_than_days`` ago (or all); what a later
    ``snapshot_download`` needs again is downloaded again. (A cache hit writes nothing, not
    even an access time, so age is counted from when a version was materialized.)"""
    now = time.time()
    removed, freed = [], 0
    for e in entries(root):
        if everything or (older_than_days is not None and now - e["created"] > older_than_days * 86400):
            if not dry_run:
                shutil.rmtree(root / "trees" / e["tree"], ignore_errors=True)
                if (root / "trees" / e["tree"]).exists():  # (not ours to remove after all): not reported
                    continue
            removed.append(e["tree"])
            freed += e["bytes"]
    if everything and not dry_run:
        shutil.rmtree(root / "follow", ignore_errors=True)
    return {"root": str(root), "removed": removed, "freed_bytes": freed, "dry_run": dry_run}
