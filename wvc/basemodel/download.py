"""Downloading a Hub base into huggingface_hub's own cache (shared with transformers)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from .. import settings
from ..errors import BaseModelError, RemoteError
from ..progress import NULL, Progress
from .base_ref import HUB_SCHEME, parse_hub

# Weight formats that duplicate the safetensors weights of most Hub repos (and are pickle,
# which wvc never reads): skipped when the repo has safetensors, so the base costs one copy.
DUPLICATE_WEIGHTS = re.compile(r".*\.(bin|pt|pth|ckpt|h5|msgpack|onnx|onnx_data|ot|tflite|gguf|pb|mlmodel)$")


def hub_cache_dir() -> str | None:
    """huggingface_hub reads its cache location at import; read it again so a later setting counts."""
    if cache := settings.text("HF_HUB_CACHE"):
        return cache
    if home := settings.text("HF_HOME"):
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

    from ..remotes import hub_model_files
    from ..remotes.hub import hub_errors
    from ..remotes.repository import holds_a_wvc_remote

    repo_id, rev = parse_hub(url)
    remote = hub_model_files(repo_id)
    cache_dir = hub_cache_dir()
    sha = rev if re.fullmatch(r"[0-9a-f]{40}", rev) else None
    offline = settings.hf_offline()
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
            raise BaseModelError(_not_cached(f"base {url}", missing, "HF_HUB_OFFLINE is set"))
    elif offline:
        raise BaseModelError(f"base {url}: HF_HUB_OFFLINE is set and a new base needs the Hub")
    what = f"base {HUB_SCHEME}{repo_id}@{rev}"
    try:
        with hub_errors(what):
            if sha is None:
                sha = remote.api.model_info(repo_id, revision=rev).sha
            if paths is None:
                files = remote.api.list_repo_files(repo_id, revision=sha)
                if holds_a_wvc_remote(files):  # its packs and catalogs are not a model's files
                    raise BaseModelError(f"{what} is a wvc remote, not a model: `wvc clone {HUB_SCHEME}{repo_id}` "
                                         "gets its history")
                has_safetensors = any(p.endswith(".safetensors") for p in files)
                paths = sorted(p for p in files if p != ".gitattributes"  # the Hub repo's git plumbing
                               and not (has_safetensors and DUPLICATE_WEIGHTS.match(p)))
            if not paths:
                raise BaseModelError(f"{what} has no files")
            progress.start(len(paths), "downloading base files", unit="files")
            found = []
            for p in paths:
                try:
                    found.append(hf_hub_download(repo_id, p, revision=sha, cache_dir=cache_dir, endpoint=remote.endpoint))
                except LocalEntryNotFoundError as exc:
                    raise BaseModelError(_not_cached(what, paths[len(found):], "the Hub is not reachable")) from exc
                progress.advance(1)
            progress.close()
    except RemoteError as exc:
        raise BaseModelError(str(exc)) from exc
    return f"{HUB_SCHEME}{repo_id}@{sha}", _snapshot_root(found[0], paths[0]), list(paths)


def cached_paths(url: str, paths: list[str]) -> set[str]:
    """Of ``paths`` of the Hub base ``url`` (pinned to a sha), those already in the local
    huggingface_hub cache: what setting it up will not download."""
    from huggingface_hub import try_to_load_from_cache

    repo_id, rev = parse_hub(url)
    if not re.fullmatch(r"[0-9a-f]{40}", rev):
        return set()
    cache_dir = hub_cache_dir()
    return {p for p in paths if isinstance(try_to_load_from_cache(repo_id, p, cache_dir=cache_dir, revision=rev), str)}


def _not_cached(what: str, missing: list[str], why: str) -> str:
    listed = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
    return f"{what}: {why} and the local huggingface_hub cache lacks {listed}"


def _snapshot_root(file_path: str, relpath: str) -> Path:
    root = Path(file_path)
    for _ in relpath.split("/"):
        root = root.parent
    return root
