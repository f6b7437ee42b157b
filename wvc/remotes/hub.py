"""A Hugging Face Hub model repo as a remote (``hf://user/repo``).

All wvc state lives on the Hub repo's ``main`` git branch as plain files (layout in
interface.py). Reads are pinned to the Hub commit sha read at the start, so a fetch sees one
consistent snapshot. A push is one ``create_commit`` with ``parent_commit`` = that sha:
the Hub refuses it (412) if anyone pushed in between, which makes the ref move an atomic
compare-and-swap. Endpoint and token follow huggingface_hub's usual rules (``HF_ENDPOINT``,
``HF_TOKEN``, the saved login). New repos are private.
"""

from __future__ import annotations

import contextlib
import io
import urllib.parse
from pathlib import Path

from .. import settings
from ..errors import RemoteFileTooLarge, RemoteNotFound, WvcError
from ..store.refs import HEADS
from .interface import (Listing, Backend, RemoteChanged, RemoteError, TransientError, content_size, local_write_errors,
                        retries_reads, upload_progress)

HUB_BRANCH = "main"


class RemoteFileNotFound(RemoteError):
    """The Hub answered 404 for a file of the repo (decided by status code, never by text)."""


class RateLimited(RemoteError):
    """The Hub answered 429 (a quota: API requests per 5 minutes, commits per hour) or 503."""

    def __init__(self, message: str, retry_after: float | None):
        super().__init__(message)
        self.retry_after = retry_after


# How long one operation may wait out rate limits in total before giving up (seconds).
MAX_WAIT_SECONDS = 300.0  # WVC_HUB_MAX_WAIT


def _retry_after(response) -> float | None:
    value = response.headers.get("Retry-After") if response is not None else None
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:  # an HTTP date: rare from the Hub; fall back to our own back-off
        return None


def backs_off(method):
    """Retry ``method`` when the Hub rate-limits it, waiting what Retry-After says (else 1,
    2, 4 ... 60 s), for at most WVC_HUB_MAX_WAIT seconds per call; then the 429 is the error.
    A rate-limited request changed nothing on the Hub, so repeating it is safe."""
    import functools

    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        import time

        limit = settings.number("WVC_HUB_MAX_WAIT", MAX_WAIT_SECONDS)
        waited, attempt = 0.0, 0
        while True:
            try:
                return method(*args, **kwargs)
            except RateLimited as exc:
                wait = exc.retry_after if exc.retry_after is not None else min(60.0, 2.0 ** attempt)
                if waited + wait > limit:
                    raise RemoteError(f"{exc} (still limited after waiting {waited:.0f} s; WVC_HUB_MAX_WAIT)") from exc
                time.sleep(wait)
                waited += wait
                attempt += 1

    return wrapper


def _transport_errors() -> tuple[type, ...]:
    """The HTTP library's transport error, whichever library this huggingface_hub uses."""
    import importlib

    from huggingface_hub import get_session

    module = importlib.import_module(type(get_session()).__module__.split(".")[0])
    return tuple(getattr(module, n) for n in ("TransportError",) if hasattr(module, n)) + (OSError,)


def _xet_failure(message: str) -> tuple[int | None, str]:
    """The HTTP status and URL in an hf_xet error ("... HTTP status client error (404 Not
    Found), domain: http://..."), or (None, "") for a failure without an answer."""
    import re

    status = re.search(r"HTTP status (?:client|server) error \((\d{3})", message)
    url = re.search(r"domain: (\S+)", message)
    return (int(status.group(1)) if status else None), (url.group(1).rstrip(")'\"") if url else "")


@contextlib.contextmanager
def hub_errors(what: str):
    """Turn client and transport failures into one clear RemoteError line."""
    from huggingface_hub import errors

    try:
        yield
    except errors.GatedRepoError as exc:
        raise RemoteError(f"{what}: gated repository: request access on the Hub and set HF_TOKEN to a token "
                          "that has it") from exc
    except errors.RepositoryNotFoundError as exc:
        raise RemoteNotFound(f"{what}: repository not found, or no permission to read it (check HF_TOKEN)") from exc
    except errors.RevisionNotFoundError as exc:
        raise RemoteError(f"{what}: revision not found") from exc
    except errors.HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else None
        if status == 404 or isinstance(exc, errors.EntryNotFoundError):
            raise RemoteFileNotFound(f"{what}: not found") from exc
        if status == 412:
            raise RemoteChanged(f"{what}: the remote changed while pushing (another push won); fetch and retry") from exc
        if status in (401, 403):
            raise RemoteError(f"{what}: permission denied (HTTP {status}); check HF_TOKEN") from exc
        if status in (429, 503):
            raise RateLimited(f"{what}: the Hub is rate-limiting us (HTTP {status})",
                              _retry_after(exc.response)) from exc
        if status is not None and status >= 500:
            raise TransientError(f"{what}: Hub error HTTP {status}: {str(exc).splitlines()[0]}") from exc
        raise RemoteError(f"{what}: Hub error HTTP {status}: {str(exc).splitlines()[0]}") from exc
    except WvcError:
        raise
    except RuntimeError as exc:  # huggingface_hub wraps a file upload's failure: judge it by its cause
        cause = exc.__cause__
        if not isinstance(cause, (errors.HfHubHTTPError, *_transport_errors())):
            raise
        with hub_errors(what):
            raise cause from exc
    except ConnectionError as exc:  # hf_xet's: the HTTP status is only in the text
        status, url = _xet_failure(str(exc))
        if status is None:
            raise TransientError(f"{what}: cannot reach the Hub endpoint or its Xet storage, or it broke off "
                                 f"({type(exc).__name__}: {str(exc)[:200]})") from exc
        where = urllib.parse.urlsplit(url).path[:80] or "the Xet service"
        if status == 404 and "/xet-" in url and "-token/" in url:
            raise RemoteError(f"{what}: the endpoint does not speak Xet (HTTP 404 at {url}), which huggingface_hub "
                              "uses whenever hf_xet is installed; set HF_HUB_DISABLE_XET=1 to upload over LFS") from exc
        if status in (429, 503):
            raise RateLimited(f"{what}: the Hub's Xet storage is rate-limiting us (HTTP {status})", None) from exc
        if status in (401, 403):
            raise RemoteError(f"{what}: Xet storage denied access (HTTP {status} at {where}); check HF_TOKEN") from exc
        if status >= 500:
            raise TransientError(f"{what}: Xet storage error HTTP {status} at {where}") from exc
        raise RemoteError(f"{what}: Xet storage refused the request (HTTP {status} at {where})") from exc
    except _transport_errors() as exc:
        raise TransientError(f"{what}: cannot reach the Hub endpoint, or it broke off ({type(exc).__name__}: "
                             f"{str(exc)[:200]})") from exc
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError: a 200 that is not the Hub's JSON
        raise TransientError(f"{what}: the endpoint answered with something that is not the Hub's API "
                             f"({type(exc).__name__}); is HF_ENDPOINT a Hub?") from exc


class HubBackend(Backend):
    deletes_atomically = True  # one create_commit adds and deletes; readers pinned to a sha keep theirs

    def __init__(self, repo_id: str, layout, revision: str | None = None, sha: str | None = None):

        from huggingface_hub import HfApi

        # Nothing process-wide is changed here (progress bars, Xet): a training script that
        # pushes through wvc keeps its own huggingface_hub settings. The endpoint is read
        # per remote, so one set after huggingface_hub was imported still counts.
        self.repo_id, self.layout = repo_id, layout
        self.revision = revision  # hf://org/name@rev: read as of that Hub revision; never pushed to
        if revision is not None:
            self.read_only = (f"hf://{repo_id}@{revision} is pinned to a revision: it can be read, not pushed to "
                              f"(push to hf://{repo_id})")
        self.url = f"hf://{repo_id}" + (f"@{revision}" if revision else "")
        self.endpoint = settings.text("HF_ENDPOINT")
        self.api = HfApi(endpoint=self.endpoint)
        self.sha = sha  # the snapshot our reads are pinned to (set by state(), or given: a base's commit)

    @backs_off
    @retries_reads
    def listing(self) -> Listing:
        from huggingface_hub import RepoFile

        with hub_errors(self.url):
            self.sha = self.api.repo_info(self.repo_id, revision=self.revision).sha
            # (list_repo_files is this same listing, less each file's git blob id)
            listed = [f for f in self.api.list_repo_tree(self.repo_id, recursive=True, revision=self.sha)
                      if isinstance(f, RepoFile)]
        paths = [f.path for f in listed]
        refs = self.layout.parse_refs({p: self.read_file(p, 256) or b"" for p in self.layout.check_ref_count(self.url, paths)})
        card = {CARD: f.blob_id for f in listed if f.path == CARD and f.blob_id}
        return Listing(refs, self.sha, frozenset(paths), card)

    def make(self) -> None:
        with hub_errors(self.url):
            self.api.create_repo(self.repo_id, private=True, exist_ok=True)

    def file_url(self, path: str) -> str:
        """Where a file is read (``/resolve/``, pinned to our snapshot)."""
        from huggingface_hub import hf_hub_url

        return hf_hub_url(self.repo_id, path, revision=self.sha or HUB_BRANCH, endpoint=self.endpoint)

    # -- the Backend's reads, of a wvc remote's files ------------------------------------------------
    def read(self, handle, limit: int) -> bytes | None:
        return self.read_file(self.layout.path(handle), limit)

    def read_range(self, handle, offset: int, length: int) -> bytes:
        return self.read_file_range(self.layout.path(handle), offset, length)

    def download(self, handle, dest: Path, limit: int) -> None:
        self.download_file(self.layout.path(handle), dest, limit)

    # -- any file of the repository, by its path (a base model's too) -------------------------------
    @backs_off
    @retries_reads
    def read_file_range(self, path: str, offset: int, length: int) -> bytes:
        """Exactly ``length`` bytes from ``offset``, streamed: never more than ``length`` bytes
        are read, whatever the endpoint sends. An endpoint that ignores Range (200 instead of
        206) is refused unless the range starts at 0, rather than downloading a whole pack."""
        from huggingface_hub import get_session
        from huggingface_hub.utils import build_hf_headers, hf_raise_for_status

        if length <= 0:
            return b""
        url = self.file_url(path)
        headers = {**build_hf_headers(), "Range": f"bytes={offset}-{offset + length - 1}"}
        buf = bytearray()
        with hub_errors(f"{self.url}/{path}"):
            with get_session().stream("GET", url, headers=headers, follow_redirects=True) as resp:
                hf_raise_for_status(resp)
                if resp.status_code != 206 and offset != 0:
                    raise RemoteError(f"{self.url}/{path}: the endpoint ignored a range request (HTTP "
                                      f"{resp.status_code}); refusing to download the whole file for {length} bytes")
                for block in resp.iter_bytes(1 << 20):
                    buf += block[: length - len(buf)]
                    if len(buf) >= length:
                        break
        if len(buf) != length:  # a body cut short (a real short file fails every attempt)
            raise TransientError(f"remote file {path} is shorter than its index says")
        self.bytes_downloaded += len(buf)
        return bytes(buf)

    def _get(self, path: str, limit: int, sink) -> None:
        from huggingface_hub import get_session
        from huggingface_hub.utils import build_hf_headers, hf_raise_for_status

        url = self.file_url(path)
        with hub_errors(f"{self.url}/{path}"):
            with get_session().stream("GET", url, headers=build_hf_headers(), follow_redirects=True) as resp:
                hf_raise_for_status(resp)
                declared = int(resp.headers.get("Content-Length") or 0)
                if declared > limit:
                    raise RemoteFileTooLarge(f"remote file {path} is larger than allowed ({declared} bytes)")
                total = 0
                for block in resp.iter_bytes(1 << 20):
                    total += len(block)
                    if total > limit:
                        raise RemoteFileTooLarge(f"remote file {path} is larger than allowed")
                    sink(block)
                if declared and total != declared:
                    raise TransientError(f"{self.url}/{path}: the body was cut short ({total} of {declared} bytes)")
                self.bytes_downloaded += total

    @backs_off
    @retries_reads
    def read_file(self, path: str, limit: int) -> bytes | None:
        """A small file (None if absent), refusing more than ``limit`` bytes."""
        buf = io.BytesIO()
        try:
            self._get(path, limit, buf.write)
        except RemoteFileNotFound:
            return None
        return buf.getvalue()

    @backs_off
    @retries_reads
    def download_file(self, path: str, dest: Path, limit: int) -> None:
        with local_write_errors(dest), open(dest, "wb") as fh:  # each attempt from the start
            self._get(path, limit, fh.write)

    def publish(self, files, refs, expected: Listing, message: str, delete=(), progress=None) -> None:
        from huggingface_hub import CommitOperationAdd, CommitOperationDelete

        progress = upload_progress(progress, files)

        new_refs = {**expected.refs, **{r: t for r, t in refs.items() if t is not None}}
        for r, t in refs.items():
            if t is None:
                new_refs.pop(r, None)
        # (paths, not open handles: huggingface_hub uploads a handle over plain HTTP, never Xet)
        ops = [CommitOperationAdd(path_in_repo=self.layout.path(h), path_or_fileobj=c if isinstance(c, bytes) else str(c))
               for h, c in files.items()]
        ops += [CommitOperationAdd(path_in_repo=r, path_or_fileobj=(t + "\n").encode()) for r, t in refs.items() if t]
        ops += [CommitOperationDelete(path_in_repo=r) for r, t in refs.items() if t is None]
        ops += [CommitOperationDelete(path_in_repo=self.layout.path(h)) for h in delete]
        # The card names branches, not commits, so that a training run's pushes leave it alone:
        # one the listing shows with the blob id of this one is neither read nor sent (each
        # rewrite cost a read of it, its upload inline in the commit and the Hub's YAML check).
        card = model_card(self.repo_id, new_refs).encode()
        if CARD not in expected.files or (expected.tokens.get(CARD) != git_blob_id(card)
                                          and is_our_card(self.read_file(CARD, MAX_CARD_BYTES) or b"")):
            ops.append(CommitOperationAdd(path_in_repo=CARD, path_or_fileobj=card))
        self._create_commit(ops, message, expected.version)
        sent = sum(map(content_size, files.values()))
        progress.advance(sent)
        progress.close()
        self.bytes_uploaded += sent

    @backs_off
    def _create_commit(self, ops, message: str, parent: str) -> None:
        with hub_errors(self.url):
            self.api.create_commit(self.repo_id, ops, commit_message=message, parent_commit=parent,
                                   revision=HUB_BRANCH)


CARD = "README.md"
CARD_MARKER = "<!-- written by wvc: replaced on every push; a README.md without this line is left alone -->"
MAX_CARD_BYTES = 1 << 20


def git_blob_id(data: bytes) -> str:
    """A file's git blob id, as the Hub's tree listing gives it."""
    import hashlib

    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def is_our_card(data: bytes) -> bool:
    """Whether a README.md is the card wvc writes (this one, or an older wvc's)."""
    text = data.decode("utf-8", "replace")
    return CARD_MARKER in text or "This repository is a [wvc](https://pypi.org/project/wvc/) remote" in text


def model_card(repo_id: str, refs: dict[str, str]) -> str:
    from importlib import metadata

    try:
        __version__ = metadata.version("wvc")
    except metadata.PackageNotFoundError:  # run from a source tree
        __version__ = "(from source)"

    branches = "\n".join(f"- `{r[len(HEADS):]}`" for r in sorted(refs) if r.startswith(HEADS))
    return f"""---
tags:
- wvc
---
{CARD_MARKER}
# {repo_id}

This repository is a wvc remote (written by wvc {__version__}, a Git-style version store for
model weights): versions of a model stored as lossless, content-addressed deltas. Packs of
compressed chunks are under `packs/`, each push's catalog (its index, commits and trees) under
`catalogs/`, branches and tags under `refs/`, and the base model it starts from, if any, in
`base.json`. It is not loadable with `from_pretrained` directly; with wvc installed, check a
version out first:

```bash
wvc clone hf://{repo_id}
```

Branches (`wvc log` shows each one's versions):

{branches}
"""
