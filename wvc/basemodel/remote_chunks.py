"""Base chunks for a view of a remote (``wvc.open``) on a machine that did not set the base up."""

from __future__ import annotations

from pathlib import Path

from .. import ids
from ..errors import BaseModelError, CorruptObject, RemoteError
from ..model.versions import Tree
from .download import hub_cache_dir
from .index import chunk_locations
from .base_ref import BaseRef, parse_hub


class RemoteBaseChunks:
    """Base chunks for a view of a remote (wvc.open) when this machine did not set the base up:
    from the huggingface_hub cache when a file is there, else by HTTP range reads from the
    base's own Hub repo (a directory base: from the directory). Every chunk is hash-checked."""

    def __init__(self, base: BaseRef, tree: Tree, directory: str | None = None):
        self.base = base
        self.directory = directory  # a directory base: the user's copy (never the path the remote recorded)
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
                hit = try_to_load_from_cache(repo_id, path, cache_dir=hub_cache_dir(), revision=sha)
                found = Path(hit) if isinstance(hit, str) else None
            else:
                candidate = Path(self.directory).joinpath(*path.split("/")) if self.directory else None
                found = candidate if candidate is not None and candidate.is_file() else None
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
            from ..remotes import hub_model_files

            if self.hub is None:
                repo_id, sha = parse_hub(self.base.url, need_sha=True)
                self.hub = hub_model_files(repo_id, sha)
            try:
                raw = self.hub.read_file_range(path, offset, length)
            except RemoteError as exc:
                raise BaseModelError(f"base {self.base.url}: {exc}") from exc
        else:
            raise BaseModelError(f"base directory {self.base.url} is not on this machine (needed for {path})")
        if ids.chunk_id(raw) != object_id:
            raise CorruptObject(f"base file {path} of {self.base.url} does not hold chunk {ids.short(object_id)}")
        return raw
