"""The remote interface and layout. Remotes hold plain files, so any store can hold them:

    wvc.json                              {"format": 1}
    base.json                             the base model, if any: {"url", "tree", "commit"} (ops/base_model.py)
    packs/pack-<hex>.pack, .idx           immutable packs (see store/packs.py) and their index
    objects/commits/<2 hex>/<id>          immutable commit objects (canonical bytes)
    objects/trees/<2 hex>/<id>            immutable tree objects
    refs/heads/<branch>, refs/tags/<tag>  the only mutable files: a commit id and a newline

A push uploads objects first and moves refs last, as one compare-and-swap (``publish``):
the refs must still be what the pusher read (``RemoteState.version``), else it is
refused. Every name read from a remote is validated before use; every object is
hash-verified by the caller before it enters a local store.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from .. import ids
from ..errors import WvcError
from ..store.refs import check_ref_name

FORMAT = 1
MAX_REF_BYTES = 200
MAX_SMALL_OBJECT = 256 << 20  # commits and trees
MAX_INDEX_BYTES = 1 << 30
MAX_BASE_RECORD = 64 << 10
MAX_OBJECT_BYTES = 1 << 30  # one chunk's payload: range reads hold it in memory
BASE_RECORD = "base.json"
_PACK = re.compile(r"^pack-([0-9a-f]{64})\.(pack|idx)$")


class RemoteError(WvcError):
    """A remote is unreachable, refuses us, or holds something invalid."""


class NonFastForward(RemoteError):
    pass


class RemoteChanged(RemoteError):
    """The remote's refs moved between reading them and publishing (a concurrent push)."""


@dataclass
class RemoteState:
    refs: dict[str, str]  # "refs/heads/main" -> commit id
    version: str | None  # what publish's compare-and-swap checks (hub commit sha, or refs digest)
    packs: list[str] = field(default_factory=list)  # pack names
    base: bytes | None = None  # base.json as stored (untrusted: ops/base_model.py parses it)


def commit_path(cid: str) -> str:
    return f"objects/commits/{cid[:2]}/{cid}"


def tree_path(tid: str) -> str:
    return f"objects/trees/{tid[:2]}/{tid}"


def pack_path(name: str, ext: str = "pack") -> str:
    return f"packs/pack-{name}.{ext}"


def parse_refs(files: dict[str, bytes]) -> dict[str, str]:
    """refs/... file contents -> validated {ref: commit id}."""
    refs = {}
    for path, data in files.items():
        kind, _, name = path.partition("/")[2].partition("/")
        if not path.startswith("refs/") or kind not in ("heads", "tags"):
            continue
        check_ref_name(name, "remote ref")
        value = data.strip().decode("ascii", "replace")
        if len(data) > MAX_REF_BYTES or not ids.is_object_id(value):
            raise RemoteError(f"remote ref {path} does not hold a commit id")
        refs[path] = value
    return refs


def parse_pack_index(data: bytes, name: str) -> list:
    """A remote ``.idx`` file (untrusted) -> validated PackEntry list."""
    import json

    from ..store.packs import PackEntry

    try:
        entries = [PackEntry(**e) for e in json.loads(data)]
    except (ValueError, TypeError) as exc:
        raise RemoteError(f"remote pack index {name[:12]} is malformed: {exc}") from None
    for e in entries:
        if not (ids.is_object_id(e.id) and (e.base is None or ids.is_object_id(e.base))
                and all(type(v) is int and v >= 0 for v in (e.offset, e.length, e.raw_size, e.method))
                and e.length <= MAX_OBJECT_BYTES and e.raw_size <= MAX_OBJECT_BYTES):
            raise RemoteError(f"remote pack index {name[:12]} holds invalid entries")
    return entries


def pack_names(paths) -> list[str]:
    names = set()
    for p in paths:
        m = _PACK.match(p.rpartition("/")[2]) if p.startswith("packs/") else None
        if m and m.group(2) == "idx":
            names.add(m.group(1))
    return sorted(names)


class Remote:
    """A backend: small-file reads, whole and ranged pack reads, and atomic publish."""

    url: str
    bytes_downloaded: int = 0
    bytes_uploaded: int = 0

    def state(self) -> RemoteState:
        raise NotImplementedError

    def read(self, path: str, limit: int) -> bytes | None:
        """A small file (None if absent), refusing more than ``limit`` bytes."""
        raise NotImplementedError

    def download(self, path: str, dest: Path, limit: int) -> None:
        """A file to ``dest`` (packs), refusing more than ``limit`` bytes."""
        raise NotImplementedError

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        """Exactly ``length`` bytes of a file from ``offset`` (streaming reads into packs)."""
        raise NotImplementedError

    def publish(self, files: dict[str, Path | bytes], refs: dict[str, str | None], expected: RemoteState,
                message: str) -> None:
        """Upload ``files``, then set ``refs`` (None deletes) iff the remote is still ``expected``."""
        raise NotImplementedError
