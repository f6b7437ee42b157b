"""Base: the model a history starts from, referenced and never stored.

``wvc init --base hf://org/name[@rev]`` resolves the revision to a Hub commit sha and
downloads the base's files through huggingface_hub into its normal cache (shared with
transformers); ``--base DIR`` uses a local directory as it is. The files are indexed
once: every chunk id -> (path, offset, length) goes into ``external_objects``, and a
deterministic root commit (fixed author and time, so every clone gets the same id) holds
the base's tree. Later commits delta against the base's chunks like against any parent's;
the bytes are read from the base files and hash-checked on every read, never copied into
``.wvc/`` and never pushed.

A remote records the base (``base.json``: url with the resolved sha, tree id, commit id).
A clone downloads the base from its own Hub repo (or finds it in the cache, offline),
re-indexes it and refuses it unless it yields exactly the recorded tree id.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from .. import ids
from ..errors import CorruptObject, MissingObject, WvcError
from ..formats.dtypes import DTYPES
from ..objects import Commit, Tree, canonical_json, chunk_spans
from ..progress import NULL, Progress
from ..store.refs import HEADS
from .snapshot import Snapshotter

HUB_SCHEME = "hf://"
BASE_AUTHOR = "wvc"
# Weight formats that duplicate the safetensors weights of most Hub repos (and are pickle,
# which wvc never reads): skipped when the repo has safetensors, so the base costs one copy.
DUPLICATE_WEIGHTS = re.compile(r".*\.(bin|pt|pth|ckpt|h5|msgpack|onnx|onnx_data|ot|tflite|gguf|pb|mlmodel)$")
MAX_BASE_JSON = 64 << 10


class BaseError(WvcError):
    """A base that cannot be resolved, downloaded or verified."""


@dataclass(frozen=True)
class BaseRef:
    url: str  # hf://org/name@<40-hex sha>, or an absolute directory path
    tree: str
    commit: str

    def to_json(self) -> dict:
        return {"url": self.url, "tree": self.tree, "commit": self.commit}

    @classmethod
    def from_json(cls, raw) -> "BaseRef":
        """Validate an untrusted base record (a remote's base.json)."""
        if not (isinstance(raw, dict) and set(raw) == {"url", "tree", "commit"}
                and isinstance(raw["url"], str) and 0 < len(raw["url"]) <= 1000
                and ids.is_object_id(raw["tree"]) and ids.is_object_id(raw["commit"])):
            raise BaseError("base record is malformed")
        if raw["url"].startswith(HUB_SCHEME):
            parse_hub(raw["url"], need_sha=True)
        elif not raw["url"].startswith("/"):
            raise BaseError(f"base record names neither a Hub repo nor an absolute path: {raw['url']!r}")
        return cls(raw["url"], raw["tree"], raw["commit"])

    @property
    def is_hub(self) -> bool:
        return self.url.startswith(HUB_SCHEME)


def parse_hub(url: str, need_sha: bool = False) -> tuple[str, str]:
    """hf://org/name[@rev] -> (repo id, revision)."""
    spec = url[len(HUB_SCHEME):]
    repo_id, _, rev = spec.partition("@")
    parts = repo_id.split("/")
    if len(parts) != 2 or not all(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", p) for p in parts) \
            or (rev and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._/-]*", rev)) or ".." in rev:
        raise BaseError(f"invalid base {url!r}: expected hf://org/name or hf://org/name@revision")
    if need_sha and not re.fullmatch(r"[0-9a-f]{40}", rev):
        raise BaseError(f"base {url!r} does not pin a commit sha")
    return repo_id, rev or "main"


def base_commit(url: str, tree_id: str) -> Commit:
    """The root commit of a base: fixed author and time, so it has the same id everywhere."""
    return Commit(tree_id, (), BASE_AUTHOR, 0, f"base {url}", {"base": url})


def current(repo) -> BaseRef | None:
    url = repo.db.get_config("base.url")
    if url is None:
        return None
    return BaseRef(url, repo.db.get_config("base.tree"), repo.db.get_config("base.commit"))


# -- indexing ----------------------------------------------------------------------------------
class _NoStatCache:
    def cached_hash(self, relpath, st, chunk_bytes):
        return None

    def remember(self, relpath, st, chunk_bytes, digest):
        pass


class _LocationRecorder:
    """Stands in for a ChunkWriter: records where each chunk is instead of storing it."""

    def __init__(self):
        self.locations: dict[str, tuple[str, int, int]] = {}

    def put(self, raw, dtype, base_id=None, origin=None) -> str:
        object_id = ids.chunk_id(raw)
        self.locations.setdefault(object_id, (origin[0], origin[1], len(raw)))
        return object_id


def index(root: Path, paths: list[str], chunk_bytes: int, progress: Progress = NULL):
    """(tree, {chunk id: (path, offset, length)}) of the files ``paths`` under ``root``."""
    recorder = _LocationRecorder()
    tree = Snapshotter(recorder, None, chunk_bytes, progress).directory(root, sorted(paths), _NoStatCache())
    return tree, recorder.locations


def chunk_locations(tree: Tree) -> dict[str, tuple[str, int, int]]:
    """Where each chunk of ``tree`` lies in its file, from the tree alone (no file read).

    A safetensors file is 8 length bytes, the header, then the tensors back to back in
    tree order; the header's length is what the tensors leave of the file size.
    """
    out: dict[str, tuple[str, int, int]] = {}
    for f in tree.files:
        if f.kind == "blob":
            for cid, (b, e) in zip(f.chunks, chunk_spans(f.size, 1, tree.chunk_bytes)):
                out.setdefault(cid, (f.path, b, e - b))
            continue
        sizes = []
        for t in f.tensors:
            dtype = DTYPES.get(t.dtype)
            if dtype is None:
                raise CorruptObject(f"{f.path}: unknown dtype {t.dtype!r}")
            numel = 1
            for d in t.shape:
                numel *= d
            sizes.append(numel * dtype.width)
        cursor = f.size - sum(sizes)
        if cursor < 8:
            raise CorruptObject(f"{f.path}: tensors larger than the file")
        out.setdefault(f.header, (f.path, 8, cursor - 8))
        for t, nbytes in zip(f.tensors, sizes):
            width = DTYPES[t.dtype].width
            for cid, (b, e) in zip(t.chunks, chunk_spans(nbytes, width, tree.chunk_bytes)):
                out.setdefault(cid, (f.path, cursor + b, e - b))
            cursor += nbytes
    return out


# -- finding the files -------------------------------------------------------------------------
def _hub_cache_dir() -> str | None:
    """huggingface_hub reads its cache location at import; read it again so a later setting counts."""
    if cache := os.environ.get("HF_HUB_CACHE"):
        return cache
    if home := os.environ.get("HF_HOME"):
        return os.path.join(home, "hub")
    return None


def download_hub(url: str, paths: list[str] | None = None, progress: Progress = NULL) -> tuple[str, Path, list[str]]:
    """Resolve and download a Hub base into the huggingface_hub cache.

    ``paths`` None: every file of the revision except duplicate weight formats. With a
    pinned sha and every file already cached, nothing touches the network.
    Returns (url pinned to the sha, snapshot directory, paths).
    """
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    from ..remotes.base import RemoteError
    from ..remotes.hub import HubRemote, hub_errors

    repo_id, rev = parse_hub(url)
    remote = HubRemote(repo_id)
    cache_dir = _hub_cache_dir()
    sha = rev if re.fullmatch(r"[0-9a-f]{40}", rev) else None
    offline = os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")
    if sha and paths is not None:  # all in the cache already: no network at all
        found, missing = [], []
        for p in paths:
            try:
                found.append(hf_hub_download(repo_id, p, revision=sha, cache_dir=cache_dir, local_files_only=True))
            except LocalEntryNotFoundError:
                missing.append(p)
        if not missing:
            return f"{HUB_SCHEME}{repo_id}@{sha}", _snapshot_root(found[0], paths[0]), list(paths)
        if offline:
            raise BaseError(_not_cached(f"base {url}", missing, "HF_HUB_OFFLINE is set"))
    elif offline:
        raise BaseError(f"base {url}: HF_HUB_OFFLINE is set and a new base needs the Hub")
    what = f"base {HUB_SCHEME}{repo_id}@{rev}"
    try:
        with hub_errors(what):
            if sha is None:
                sha = remote.api.model_info(repo_id, revision=rev).sha
            if paths is None:
                files = remote.api.list_repo_files(repo_id, revision=sha)
                has_safetensors = any(p.endswith(".safetensors") for p in files)
                paths = sorted(p for p in files if p != ".gitattributes"  # the Hub repo's git plumbing
                               and not (has_safetensors and DUPLICATE_WEIGHTS.match(p)))
            if not paths:
                raise BaseError(f"{what} has no files")
            progress.start(len(paths), "downloading base files")
            found = []
            for p in paths:
                try:
                    found.append(hf_hub_download(repo_id, p, revision=sha, cache_dir=cache_dir, endpoint=remote.endpoint))
                except LocalEntryNotFoundError:
                    raise BaseError(_not_cached(what, paths[len(found):], "the Hub is not reachable")) from None
                progress.advance(1)
            progress.close()
    except RemoteError as exc:
        raise BaseError(str(exc)) from None
    return f"{HUB_SCHEME}{repo_id}@{sha}", _snapshot_root(found[0], paths[0]), list(paths)


def _not_cached(what: str, missing: list[str], why: str) -> str:
    listed = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
    return f"{what}: {why} and the local huggingface_hub cache lacks {listed}"


def _snapshot_root(file_path: str, relpath: str) -> Path:
    root = Path(file_path)
    for _ in relpath.split("/"):
        root = root.parent
    return root


def _regular_file(root: Path, relpath: str) -> bool:
    from ..fsutil import resolve_inside

    try:
        full = resolve_inside(root, relpath)
    except WvcError:
        return False
    return full.is_file() and not full.is_symlink()


def locate(repo) -> Path:
    """The base's directory for reading chunks; re-downloads a Hub base the cache lost."""
    base = current(repo)
    if base is None:
        raise MissingObject("this repository has no base")
    recorded = Path(repo.db.get_config("base.dir") or "/nonexistent")
    if recorded.is_dir():
        return recorded
    if not base.is_hub:
        raise BaseError(f"base directory {base.url} is gone; restore it to read this repository's history")
    tree = repo.read_tree(base.tree)
    _, root, _ = download_hub(base.url, [f.path for f in tree.files])
    return root


class RemoteBaseChunks:
    """Base chunks for a view of a remote (wvc.open) when this machine did not attach the base:
    from the huggingface_hub cache when a file is there, else by HTTP range reads from the
    base's own Hub repo (a directory base: from the directory). Every chunk is hash-checked."""

    def __init__(self, base: BaseRef, tree: Tree):
        self.base = base
        self.locations = chunk_locations(tree)
        self.hub = None
        self.local: dict[str, Path | None] = {}

    def __contains__(self, object_id: str) -> bool:
        return object_id in self.locations

    def _local_file(self, path: str) -> Path | None:
        if path not in self.local:
            found = None
            if self.base.is_hub:
                from huggingface_hub import try_to_load_from_cache

                repo_id, sha = parse_hub(self.base.url, need_sha=True)
                hit = try_to_load_from_cache(repo_id, path, cache_dir=_hub_cache_dir(), revision=sha)
                found = Path(hit) if isinstance(hit, str) else None
            else:
                candidate = Path(self.base.url).joinpath(*path.split("/"))
                found = candidate if candidate.is_file() else None
            self.local[path] = found
        return self.local[path]

    def __call__(self, object_id: str) -> bytes:
        path, offset, length = self.locations[object_id]
        local = self._local_file(path)
        if local is not None:
            with open(local, "rb") as fh:
                fh.seek(offset)
                raw = fh.read(length)
        elif self.base.is_hub:
            from ..remotes.base import RemoteError
            from ..remotes.hub import HubRemote

            if self.hub is None:
                repo_id, sha = parse_hub(self.base.url, need_sha=True)
                self.hub = HubRemote(repo_id)
                self.hub.sha = sha
            try:
                raw = self.hub.read_range(path, offset, length)
            except RemoteError as exc:
                raise BaseError(f"base {self.base.url}: {exc}") from None
        else:
            raise BaseError(f"base directory {self.base.url} is not on this machine (needed for {path})")
        if ids.chunk_id(raw) != object_id:
            raise CorruptObject(f"base file {path} of {self.base.url} does not hold chunk {ids.short(object_id)}")
        return raw


# -- attaching a base to a repository ------------------------------------------------------------
def resolve(spec: str, *, chunk_bytes: int, paths: list[str] | None = None, progress: Progress = NULL):
    """Download (Hub) or find (DIR) a base and index it: (url, root, tree, locations)."""
    if spec.startswith(HUB_SCHEME):
        url, root, paths = download_hub(spec, paths, progress)
    else:
        root = Path(spec).expanduser().resolve()
        url = str(root)
        if not root.is_dir():
            raise BaseError(f"base directory {root} does not exist")
        if paths is None:
            from ..worktree import scan

            paths = scan(root).files
        else:  # a remote's record: look at exactly those files (validated relative paths), scan nothing
            missing = [p for p in paths if not _regular_file(root, p)]
            if missing:
                raise BaseError(f"base directory {root} does not hold the files this history was made from "
                                f"(missing {', '.join(missing[:5])})")
        if not paths:
            raise BaseError(f"base directory {root} has no files")
    tree, locations = index(root, paths, chunk_bytes, progress)
    return url, root, tree, locations


def attach(repo, spec: str, *, expected: BaseRef | None = None, expected_tree: Tree | None = None,
           set_branch: bool = True, progress: Progress = NULL) -> BaseRef:
    """Index the base ``spec`` and record it as this repository's root.

    ``expected`` and its verified ``expected_tree`` (clone): the base a remote recorded;
    the files found must give exactly that tree id.
    """
    if current(repo) is not None:
        raise BaseError("this repository already has a base")
    paths = [f.path for f in expected_tree.files] if expected_tree is not None else None
    chunk_bytes = expected_tree.chunk_bytes if expected_tree is not None else repo.chunk_bytes
    url, root, tree, locations = resolve(spec, chunk_bytes=chunk_bytes, paths=paths, progress=progress)
    if expected is not None and tree.id != expected.tree and _same_files(tree, expected_tree):
        tree = expected_tree  # recorded by an older wvc (tree format 1): the same files, its ids
    if expected is not None and tree.id != expected.tree:
        raise BaseError(f"base {url} does not match the one this history was made from: its files give tree "
                        f"{ids.short(tree.id)}, the remote recorded {ids.short(expected.tree)} (base files changed?)")
    commit = base_commit(url, tree.id)
    with repo.db.write():
        repo.db.conn.executemany("INSERT OR IGNORE INTO external_objects VALUES (?, ?, ?, ?)",
                                 [(cid, p, off, n) for cid, (p, off, n) in locations.items()])
        repo.db.conn.execute("INSERT OR IGNORE INTO trees VALUES (?, ?)", (tree.id, tree.to_bytes()))
        repo.db.conn.execute("INSERT OR IGNORE INTO commits VALUES (?, ?, ?, ?, ?)",
                             (commit.id, tree.id, commit.timestamp, 0, commit.to_bytes()))
        for key, value in (("base.url", url), ("base.tree", tree.id), ("base.commit", commit.id),
                           ("base.dir", str(root))):
            repo.db.set_config(key, value)
        if set_branch:
            branch = repo.refs.head_branch()
            repo.refs.set(HEADS + branch, commit.id, repo.refs.get(HEADS + branch), f"base: {url}")
    return BaseRef(url, tree.id, commit.id)


def _same_files(tree: Tree, recorded: Tree | None) -> bool:
    """Whether ``recorded`` (a verified tree of another format) lists exactly the files of
    ``tree``, compared by content id, which depends only on the chunk lists."""
    return (recorded is not None and recorded.format != tree.format and recorded.chunk_bytes == tree.chunk_bytes
            and [(f.path, f.content_id) for f in recorded.files] == [(f.path, f.content_id) for f in tree.files])


def base_json(ref: BaseRef) -> bytes:
    return canonical_json(ref.to_json())


def parse_base_json(data: bytes) -> BaseRef:
    import json

    if len(data) > MAX_BASE_JSON:
        raise BaseError("remote base record is too large")
    try:
        raw = json.loads(data)
    except ValueError:
        raise BaseError("remote base record is not JSON") from None
    return BaseRef.from_json(raw)


def verify(repo) -> list[str]:
    """fsck of the base: every recorded chunk re-read from its file and hash-checked."""
    errors = []
    base = current(repo)
    if base is None:
        return errors
    bad_files = set()
    try:
        root = repo.store.external.root()
    except WvcError as exc:
        return [str(exc)]
    tree = repo.read_tree(base.tree)
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
    for cid, path, off, n in repo.db.query("SELECT id, path, offset, length FROM external_objects ORDER BY path, offset"):
        if path in bad_files:
            continue
        try:
            repo.store.external.read(cid, path, off, n)
        except WvcError as exc:
            errors.append(str(exc))
            bad_files.add(path)
    return errors
