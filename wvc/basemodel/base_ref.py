"""The base model a history starts from (``BaseRef``), referenced and never stored.

``hf://org/name@<sha>`` (a Hub repo pinned to a commit) or an absolute directory, with the
id of the tree its files give and of the root commit that holds that tree. A repository
keeps it in its config; a remote keeps it as ``base.json`` (untrusted: parsed here).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..store import config_keys
from .. import ids
from ..errors import BaseModelError, RemoteError
from ..model.versions import Commit, canonical_json
from ..remotes.urls import HF as HUB_SCHEME  # (the one spelling of the scheme)

BASE_AUTHOR = "wvc"
MAX_BASE_JSON = 64 << 10


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
            raise BaseModelError("base record is malformed")
        if raw["url"].startswith(HUB_SCHEME):
            parse_hub(raw["url"], need_sha=True)
        elif not raw["url"].startswith("/"):
            raise BaseModelError(f"base record names neither a Hub repo nor an absolute path: {raw['url']!r}")
        return cls(raw["url"], raw["tree"], raw["commit"])

    @property
    def is_hub(self) -> bool:
        return self.url.startswith(HUB_SCHEME)


def parse_hub(url: str, need_sha: bool = False) -> tuple[str, str]:
    """hf://org/name[@rev] -> (repo id, revision), by the one remote URL parser (remotes/urls.py)."""
    from ..remotes.urls import parse

    try:
        where = parse(url)
    except RemoteError as exc:
        raise BaseModelError(f"invalid base {url!r}: {str(exc).partition(': ')[2] or exc}") from None
    if where.kind != "hub":
        raise BaseModelError(f"invalid base {url!r}: expected hf://org/name or hf://org/name@revision")
    if need_sha and not where.pins_sha:
        raise BaseModelError(f"base {url!r} does not pin a commit sha")
    return where.repo_id, where.revision or "main"


def base_commit(url: str, tree_id: str) -> Commit:
    """The root commit of a base: fixed author and time, so it has the same id everywhere."""
    return Commit(tree_id, (), BASE_AUTHOR, 0, f"base {url}", {"base": url})


def current(db) -> BaseRef | None:
    """The base recorded in a repository's database, or None."""
    url = db.get_config(config_keys.BASE_URL)
    if url is None:
        return None
    return BaseRef(url, db.get_config(config_keys.BASE_TREE), db.get_config(config_keys.BASE_COMMIT))


def base_json(ref: BaseRef) -> bytes:
    return canonical_json(ref.to_json())


def parse_base_json(data: bytes) -> BaseRef:
    if len(data) > MAX_BASE_JSON:
        raise BaseModelError("remote base record is too large")
    try:
        raw = json.loads(data)
    except (ValueError, RecursionError) as exc:  # RecursionError: nesting deeper than the parser's stack
        raise BaseModelError("remote base record is not JSON") from exc
    return BaseRef.from_json(raw)
