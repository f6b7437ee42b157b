"""Every remote URL wvc takes, parsed and validated in one place (issue 67: two ``hf://``
parsers with different rules had grown apart, and three more places picked URLs apart):

- ``hf://user/repo[@revision]``: a Hugging Face model repo, read as of ``revision`` if given;
- ``hf://buckets/namespace/bucket[/prefix]``: a Hugging Face Storage Bucket;
- ``s3://bucket[/prefix]``: an S3-protocol bucket;
- a path, or ``file://`` and a path: a directory.

A base model (``wvc init --base``) is a Hub repo URL under the same rules. Nothing here
touches the network or imports a client library beyond huggingface_hub's name check."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import RemoteError

HF = "hf://"
BUCKETS = HF + "buckets/"
S3 = "s3://"
FILE = "file://"

_S3_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_SHA = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class RemoteURL:
    """A parsed remote URL: ``kind`` is "hub", "bucket", "s3" or "path"."""

    kind: str
    repo_id: str = ""  # hub: user/repo; bucket: namespace/bucket; s3: the bucket
    revision: str | None = None  # hub: the revision after "@", if any
    prefix: str = ""  # bucket: "a/b"; s3: "a/b/" (with the slash the keys are built with)
    path: str | None = None  # path: as given (relative or with ~)

    @property
    def pins_sha(self) -> bool:
        """Whether a Hub URL names a full commit sha (a base must: its files are then fixed)."""
        return self.revision is not None and bool(_SHA.fullmatch(self.revision))


def is_hub(url: str) -> bool:
    """A Hugging Face model repo's URL (not a bucket's)."""
    return url.startswith(HF) and not url.startswith(BUCKETS)


def local_path(url: str) -> str | None:
    """The filesystem path a directory remote's URL names (a path, or ``file://`` and a
    path), as given (relative or with ``~``); None for any other URL."""
    path = url.removeprefix(FILE)
    return None if "://" in path else path


def local_repository(url) -> str | None:
    """The directory of a local wvc repository (one with ``.wvc/``) that ``url`` names, or
    None (a remote, or a path that holds no repository)."""
    from pathlib import Path

    path = local_path(str(url))
    return path if path is not None and (Path(path) / ".wvc").is_dir() else None


def parse(url: str) -> RemoteURL:
    """``url`` parsed, or RemoteError naming what is wrong with it."""
    if url.startswith(BUCKETS):
        return _bucket(url)
    if url.startswith(HF):
        return _hub(url)
    if url.startswith(S3):
        return _s3(url)
    path = local_path(url)
    if path is None:
        raise RemoteError(f"unsupported remote URL {url.removeprefix(FILE)!r}: use hf://user/repo, "
                          "s3://bucket/prefix, a path or file:///path")
    return RemoteURL("path", path=path)


def _check_repo_id(repo_id: str, url: str, what: str) -> None:
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        raise RemoteError(f"invalid {what} {url!r}: {exc}") from exc


def _hub(url: str) -> RemoteURL:
    repo_id, at, revision = url[len(HF):].strip("/").partition("@")
    parts = repo_id.split("/")
    if len(parts) != 2 or not all(parts) or any(p in (".", "..") for p in parts) or (at and not revision):
        raise RemoteError(f"invalid Hub URL {url!r}: expected hf://user/repo or hf://user/repo@revision")
    _check_repo_id(repo_id, url, "Hub URL")
    if revision and (len(revision) > 255 or any(c in revision for c in " ~^:?*[\\") or ".." in revision):
        raise RemoteError(f"invalid Hub URL {url!r}: {revision!r} is not a revision name")
    return RemoteURL("hub", repo_id=repo_id, revision=revision or None)


def _bucket(url: str) -> RemoteURL:
    rest = url[len(BUCKETS):].strip("/")
    parts = rest.split("/")
    if len(parts) < 2 or not all(parts) or any(p in (".", "..") for p in parts) or "@" in rest:
        raise RemoteError(f"invalid bucket URL {url!r}: expected hf://buckets/namespace/bucket[/prefix]")
    _check_repo_id("/".join(parts[:2]), url, "bucket URL")
    return RemoteURL("bucket", repo_id="/".join(parts[:2]), prefix="/".join(parts[2:]))


def _s3(url: str) -> RemoteURL:
    bucket, _, prefix = url[len(S3):].partition("/")
    prefix = prefix.strip("/")
    if not _S3_BUCKET.fullmatch(bucket) or ".." in bucket:
        raise RemoteError(f"invalid S3 URL {url!r}: expected s3://bucket[/prefix] with a valid bucket name")
    if prefix and any(part in ("", ".", "..") for part in prefix.split("/")):
        raise RemoteError(f"invalid S3 URL {url!r}: the prefix has an empty, '.' or '..' component")
    return RemoteURL("s3", repo_id=bucket, prefix=prefix + "/" if prefix else "")
