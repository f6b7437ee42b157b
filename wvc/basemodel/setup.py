"""Setting a base model up in a repository (indexing its files, recording it as the history's
root), finding its files again, and checking them (fsck)."""

from __future__ import annotations

import re

from pathlib import Path

from ..store import config_keys
from .. import ids
from ..errors import BaseModelError, MissingObject, WvcError
from ..model.versions import Tree
from ..progress import NULL, Progress
from ..store.graph import CommitGraph
from ..remotes.repository import is_directory_remote
from ..store.refs import HEADS
from .download import download_hub
from .index import chunk_locations, index
from .base_ref import HUB_SCHEME, BaseRef, base_commit, current


def _regular_file(root: Path, relpath: str) -> bool:
    from ..fsutil import resolve_inside

    try:
        full = resolve_inside(root, relpath)
    except WvcError:
        return False
    return full.is_file() and not full.is_symlink()


def locate(db) -> Path:
    """The base's directory for reading chunks; re-downloads a Hub base the cache lost.
    Takes the database alone: the repository hands it to its store as a callable."""
    base = current(db)
    if base is None:
        raise MissingObject("this repository has no base")
    recorded = Path(db.get_config(config_keys.BASE_DIR) or "/nonexistent")
    if recorded.is_dir():
        return recorded
    if not base.is_hub:
        raise BaseModelError(f"base directory {base.url} is gone; restore it to read this repository's history")
    tree = CommitGraph(db).read_tree(base.tree)
    _, root, _ = download_hub(base.url, [f.path for f in tree.files])
    return root


# -- setting a base up in a repository ------------------------------------------------------------
def resolve(spec: str, *, chunk_bytes: int, paths: list[str] | None = None, progress: Progress = NULL):
    """Download (Hub) or find (DIR) a base and index it: (url, root, tree, locations)."""
    if spec.startswith(HUB_SCHEME):
        url, root, paths = download_hub(spec, paths, progress)
    else:
        root = Path(spec).expanduser().resolve()
        url = str(root)
        if not root.is_dir():
            hint = ""
            if re.fullmatch(r"[\w.-]+/[\w.-]+", spec):  # looks like a Hub model id
                hint = f" (a model on the Hub is written hf://{spec})"
            raise BaseModelError(f"base directory {root} does not exist{hint}")
        if paths is None:
            from ..worktree.scan import scan

            if is_directory_remote(root):
                raise BaseModelError(f"base directory {root} is a wvc remote, not a model: `wvc clone {root}` "
                                     "gets its history")

            paths = scan(root).files
        else:  # a remote's record: look at exactly those files (validated relative paths), scan nothing
            missing = [p for p in paths if not _regular_file(root, p)]
            if missing:
                raise BaseModelError(f"base directory {root} does not hold the files this history was made from "
                                f"(missing {', '.join(missing[:5])})")
        if not paths:
            raise BaseModelError(f"base directory {root} has no files")
    tree, locations = index(root, paths, chunk_bytes, progress)
    return url, root, tree, locations


def set_base(repo, spec: str, *, expected: BaseRef | None = None, expected_tree: Tree | None = None,
           set_branch: bool = True, progress: Progress = NULL) -> BaseRef:
    """Index the base ``spec`` and record it as this repository's root.

    ``expected`` and its verified ``expected_tree`` (clone): the base a remote recorded;
    the files found must give exactly that tree id.
    """
    if current(repo.db) is not None:
        raise BaseModelError("this repository already has a base")
    paths = [f.path for f in expected_tree.files] if expected_tree is not None else None
    chunk_bytes = expected_tree.chunk_bytes if expected_tree is not None else repo.chunk_bytes
    url, root, tree, locations = resolve(spec, chunk_bytes=chunk_bytes, paths=paths, progress=progress)
    if expected is not None and not expected.is_hub:
        url = expected.url  # the history's name for its base (its root commit's id depends on it), read from spec
    if expected is not None and tree.id != expected.tree and _same_files(tree, expected_tree):
        tree = expected_tree  # recorded by an older wvc (tree format 1): the same files, its ids
    if expected is not None and tree.id != expected.tree:
        raise BaseModelError(f"base {url} does not match the one this history was made from: its files give tree "
                        f"{ids.short(tree.id)}, the remote recorded {ids.short(expected.tree)} (base files changed?)")
    commit = base_commit(url, tree.id)
    def settings():
        for key, value in ((config_keys.BASE_URL, url), (config_keys.BASE_TREE, tree.id),
                           (config_keys.BASE_COMMIT, commit.id), (config_keys.BASE_DIR, str(root))):
            repo.db.set_config(key, value)

    branch = repo.refs.head_branch() if set_branch else None
    # referenced, not stored: the root commit costs nothing (stored bytes 0)
    repo.record([(commit, tree, 0)], externals=locations, during=settings,
                ref=HEADS + branch if branch else None, expected=repo.refs.get(HEADS + branch) if branch else None,
                reason=f"base: {url}")
    return BaseRef(url, tree.id, commit.id)


def _same_files(tree: Tree, recorded: Tree | None) -> bool:
    """Whether ``recorded`` (a verified tree of another format) lists exactly the files of
    ``tree``, compared by content id, which depends only on the chunk lists."""
    return (recorded is not None and recorded.format != tree.format and recorded.chunk_bytes == tree.chunk_bytes
            and [(f.path, f.content_id) for f in recorded.files] == [(f.path, f.content_id) for f in tree.files])


def verify(repo) -> list[str]:
    """fsck of the base: every recorded chunk re-read from its file and hash-checked."""
    errors = []
    base = current(repo.db)
    if base is None:
        return errors
    bad_files = set()
    try:
        root = repo.store.external.root()
    except WvcError as exc:
        return [str(exc)]
    tree = repo.graph.read_tree(base.tree)
    locations = chunk_locations(tree)
    for f in tree.files:  # the chunks tile each file but the length prefix
        full = root.joinpath(*f.path.split("/"))
        try:
            size = full.stat().st_size
            with open(full, "rb") as fh:
                prefix = fh.read(8)
        except OSError:
            errors.append(f"base file {f.path} is missing from {root}")
            bad_files.add(f.path)
            continue
        if size != f.size or (f.kind == "safetensors" and int.from_bytes(prefix, "little") != locations[f.header][2]):
            errors.append(f"base file {f.path} changed since the base was recorded ({size} bytes, recorded {f.size})")
            bad_files.add(f.path)
    for cid, path, off, n in repo.store.external_rows():
        if path in bad_files:
            continue
        try:
            repo.store.external.read(cid, path, off, n)
        except WvcError as exc:
            errors.append(str(exc))
            bad_files.add(path)
    return errors
