"""A Hugging Face Storage Bucket as a remote (``hf://buckets/<namespace>/<bucket>[/<prefix>]``).

A bucket is mutable, unversioned, Xet-backed object storage with no commits (so no commit
quota: a run can publish every step) and no compare-and-swap, and its batches are not
transactional. wvc therefore writes only immutable, uniquely named files (packs and catalogs
as everywhere) and moves refs through a log of entries, each naming its predecessor:

- ``reflog/<seq>-<nonce>.json`` holds the whole ref map and ``prev``, the entry it follows;
- ``reflog/<seq>-<nonce>.ok`` (a server-side copy of it) confirms it. The head is the
  confirmed entry of the highest ``seq``; readers never follow an unconfirmed one.

A push uploads its objects, then proposes the entry that follows the head it read, lists the
log, and confirms its proposal only if no other live proposal or confirmed entry sits at its
``seq`` or later; otherwise it retracts (deletes) its proposal, backs off a random while and
looks again: if the winner moved a ref this push moves, the push is a non-fast-forward;
otherwise it proposes again on top of the winner. Two pushers never both confirm: with a
listing that sees every write completed before it (the Hub's, and the local server's), the
one that listed second saw the other's proposal.

A proposal is a lease of STALE_SECONDS on the bucket's clock: after it, others take it for a
crashed pusher's. So a confirmation counts only if the bucket's upload time of the ``.ok`` is
within half the lease of the ``.json``'s: a confirm that lands later (a request held in a
queue, resent after a 429's Retry-After) is ignored by every reader, whatever it did on the
way. The confirm is sent once, never resent by the back-off; the pusher then lists the log
and has landed only if its entry is confirmed and counts. The argument is in docs/design.md.
"""

from __future__ import annotations

import json
import logging
import random
import re
import secrets
import time
import urllib.parse
from datetime import datetime

from .. import settings
from ..errors import CorruptObject, NonFastForward, RemoteNotFound
from ..formats import bounded_json
from .hub import HubBackend, RateLimited, RemoteFileNotFound, _transport_errors, backs_off, hub_errors
from .interface import (Listing, RemoteChanged, RemoteError, content_size, retries_reads,
                        upload_progress)

# seq: 12 digits or more (a remote may have written any number: the next one always matches)
ENTRY = re.compile(r"(\d{12,})-([0-9a-f]{16})")
# An unconfirmed proposal older than this (by the bucket's own upload times) is a crashed
# pusher's: others pass over it. A pusher confirms only within half of it (see publish).
STALE_SECONDS = 30.0  # WVC_BUCKET_STALE_SECONDS
KEEP_ENTRIES = 16  # confirmed log entries kept behind the head (older ones are deleted)
MAX_ENTRY_BYTES = 4 << 20
MAX_LISTED = 1_000_000

log = logging.getLogger(__name__)


def _seq(name: str) -> int:
    return int(name.partition("-")[0])


def _order(name: str) -> tuple[int, str]:
    """Entries in log order (a name's digits may outgrow 12: not a string order)."""
    return _seq(name), name


def _time(value) -> float:
    if isinstance(value, datetime):
        return value.timestamp()
    return 0.0


class ListedFile:
    """A file of a bucket's listing (what huggingface_hub's BucketFile holds), checked as it
    is read; its upload time parsed when asked for."""

    __slots__ = ("path", "size", "xet_hash", "_uploaded")

    def __init__(self, path: str, size: int, xet_hash: str, uploaded: str | None):
        self.path, self.size, self.xet_hash, self._uploaded = path, size, xet_hash, uploaded

    @classmethod
    def parse(cls, item, url: str) -> "ListedFile | None":
        """One entry of the tree endpoint's answer; None for a folder."""
        if not isinstance(item, dict) or item.get("type") not in ("file", "directory") \
                or not isinstance(item.get("path"), str):
            raise RemoteError(f"{url}: the bucket's listing holds a malformed entry")
        if item["type"] == "directory":
            return None
        size, xet_hash, uploaded = item.get("size"), item.get("xetHash"), item.get("uploadedAt")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0 or not isinstance(xet_hash, str) \
                or not (uploaded is None or isinstance(uploaded, str)):
            raise RemoteError(f"{url}: the bucket's listing holds a malformed entry for {item['path']!r}")
        return cls(item["path"], size, xet_hash, uploaded)

    @property
    def uploaded_at(self) -> datetime | None:
        from huggingface_hub.utils import parse_datetime

        try:
            return parse_datetime(self._uploaded) if self._uploaded else None
        except ValueError as exc:
            raise RemoteError(f"the bucket lists {self.path!r} with a malformed upload time") from exc


class BucketBackend(HubBackend):
    deletes_atomically = False  # a batch is not a transaction: replaced files are retired, then deleted

    def __init__(self, bucket_id: str, layout, prefix: str = ""):
        from huggingface_hub import HfApi

        self.layout = layout
        self.repo_id = bucket_id  # (HubBackend's reads use repo_id only through file_url)
        self.bucket_id, self.prefix = bucket_id, prefix.strip("/")
        self.revision, self.sha = None, None
        self.url = f"hf://buckets/{bucket_id}" + (f"/{self.prefix}" if self.prefix else "")
        self.endpoint = settings.text("HF_ENDPOINT")
        self.api = HfApi(endpoint=self.endpoint)
        self.head: str | None = None
        self.stale = settings.number("WVC_BUCKET_STALE_SECONDS", STALE_SECONDS)

    # -- paths -----------------------------------------------------------------------------------
    def _key(self, path: str) -> str:
        return f"{self.prefix}/{path}" if self.prefix else path

    def file_url(self, path: str) -> str:
        return f"{self.endpoint or 'https://huggingface.co'}/buckets/{self.bucket_id}/resolve/" + \
            urllib.parse.quote(self._key(path))

    @backs_off
    @retries_reads
    def _list(self, sub: str = "") -> dict:
        """Every file under the prefix (or under ``sub`` in it): relative path -> ListedFile.

        The tree endpoint ``list_bucket_tree`` reads, paged the same way, but each file kept as
        it came: huggingface_hub parses two timestamps a file, two thirds of a listing's time once
        the grace hour's retired files are listed (16 ms for 800 files, against 3 ms for the
        request); only the ref log's entries need a time, read when used."""
        from huggingface_hub.utils import build_hf_headers, paginate

        under = self._key(sub).rstrip("/")
        out = {}
        try:
            with hub_errors(self.url):
                items = paginate(path=f"{self.api.endpoint}/api/buckets/{self.bucket_id}/tree"
                                      + ("/" + urllib.parse.quote(under, safe="") if under else ""),
                                 params={"recursive": True}, headers=build_hf_headers(token=self.api.token))
                for raw in items:
                    item = ListedFile.parse(raw, self.url)
                    if item is None:  # a folder
                        continue
                    path = item.path
                    if self.prefix:
                        if not path.startswith(self.prefix + "/"):
                            continue
                        path = path[len(self.prefix) + 1:]
                    out[path] = item
                    if len(out) > MAX_LISTED:
                        raise RemoteError(f"{self.url} lists more than {MAX_LISTED} files")
        except RemoteFileNotFound as exc:  # a plain 404 for the bucket itself
            raise RemoteNotFound(f"{self.url}: bucket not found, or no permission to read it (check HF_TOKEN)") from exc
        return out

    @backs_off
    def _batch(self, **ops) -> None:
        """Objects, proposals, retractions: repeating them is harmless, so huggingface_hub's
        own retries and the back-off here may resend them."""
        ops = {k: [(c, self._key(p)) for c, p in v] if k == "add" else v for k, v in ops.items()}
        with hub_errors(self.url):
            self.api.batch_bucket_files(self.bucket_id, **ops)

    def _send_once(self, operation: dict) -> None:
        """One operation in one batch request, sent once: not through ``batch_bucket_files``,
        whose HTTP layer resends a 429 or a 5xx after the wait the server names."""
        from huggingface_hub import get_session
        from huggingface_hub.utils import hf_raise_for_status

        headers = {**self.api._build_hf_headers(), "Content-Type": "application/x-ndjson"}
        with hub_errors(self.url):
            response = get_session().post(f"{self.api.endpoint}/api/buckets/{self.bucket_id}/batch", headers=headers,
                                          content=json.dumps(operation).encode() + b"\n")
            if response.status_code in (200, 422) and response.json().get("failed"):
                raise RemoteError(f"{self.url}: the bucket refused {operation['type']} of {operation['path']}")
            hf_raise_for_status(response)

    # -- the ref log -----------------------------------------------------------------------------
    def _log(self, listing: dict) -> tuple[dict, set]:
        """(proposals by entry name -> listed file, the names whose confirmation counts) of a
        listing. A ``.ok`` counts when its ``.json`` is listed and the bucket uploaded it within
        half the lease of the ``.json`` (its own clock; see the module docstring)."""
        entries, oks = {}, {}
        for path, item in listing.items():
            if not path.startswith(self.layout.reflog):
                continue
            name, _, ext = path[len(self.layout.reflog):].rpartition(".")
            if not ENTRY.fullmatch(name):
                continue
            if ext == "json":
                entries[name] = item
            elif ext == "ok":
                oks[name] = item
        confirmed = {n for n, ok in oks.items() if n in entries
                     and _time(ok.uploaded_at) - _time(entries[n].uploaded_at) < self.stale / 2}
        return entries, confirmed

    def _head(self, listing: dict) -> str | None:
        """The confirmed entry of the highest seq. Two at one seq never come of wvc's protocol
        (docs/design.md); a bucket that holds them anyway is read the same way by everyone:
        the one confirmed first by the bucket's clock, then by name, with a warning."""
        entries, confirmed = self._log(listing)
        if not confirmed:
            return None
        top_seq = max(map(_seq, confirmed))
        tied = [n for n in confirmed if _seq(n) == top_seq]
        if len(tied) == 1:
            return tied[0]
        oks = {n: _time(listing[f"{self.layout.reflog}{n}.ok"].uploaded_at) for n in tied}
        chosen = min(tied, key=lambda n: (oks[n], n))
        log.warning("%s: %d ref updates were confirmed at entry %d; reading %s, the first confirmed (the others "
                    "are ignored, and the next push removes them)", self.url, len(tied), top_seq, chosen)
        return chosen

    def _entry(self, name: str) -> dict[str, str]:
        """The refs a log entry holds, validated."""
        data = self.read_file(f"{self.layout.reflog}{name}.json", MAX_ENTRY_BYTES)
        if data is None:
            raise RemoteChanged(f"{self.url}: ref log entry {name} vanished while reading (tidied by a newer push); "
                                "try again")
        try:
            entry = bounded_json.loads(data, f"ref log entry {name}")
            refs = entry["refs"]
            ok = entry.get("format") == 1 and entry.get("seq") == _seq(name) and isinstance(refs, dict)
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError, CorruptObject):  # (deeply nested, dense)
            ok = False
        if not ok:
            raise RemoteError(f"{self.url}: ref log entry {name} is malformed")
        if not all(isinstance(r, str) and isinstance(c, str) for r, c in refs.items()):
            raise RemoteError(f"{self.url}: ref log entry {name} is malformed")
        return self.layout.parse_refs({r: c.encode() for r, c in refs.items()})  # names and commit ids checked there

    # -- Backend -----------------------------------------------------------------------------------
    def make(self) -> None:
        with hub_errors(self.url):
            self.api.create_bucket(self.bucket_id, private=True, exist_ok=True)

    def listing(self) -> Listing:
        listing = self._list()
        paths = [p for p in listing if not p.startswith(self.layout.reflog)]
        self.head = self._head(listing)
        refs = self._entry(self.head) if self.head else {}
        return Listing(refs, self.head or "", frozenset(paths))

    def read_ref(self, ref: str) -> str | None:
        head = self._head(self._list(self.layout.reflog))
        return self._entry(head).get(ref) if head else None

    def delete(self, handles, *, in_attic: bool = False) -> None:
        if in_attic:
            raise RemoteError("a bucket has no attic")  # (moves_retired is False: nothing moved there)
        if handles:
            self._batch(delete=[self._key(self.layout.path(h)) for h in handles])

    def publish(self, files, refs, expected: Listing, message: str, delete=(), progress=None) -> None:
        if delete:
            raise RemoteError("a bucket cannot delete files atomically with a ref update")
        progress = upload_progress(progress, files)
        if files:  # objects first: immutable and uniquely named, so a retried upload is harmless
            self._batch(add=[(c if isinstance(c, bytes) else str(c), self.layout.path(h)) for h, c in files.items()])
        sent = sum(map(content_size, files.values()))
        progress.advance(sent)
        progress.close()
        self.bytes_uploaded += sent
        self._move_refs(refs, expected)

    def _move_refs(self, refs: dict, expected: Listing) -> None:
        head, current = expected.version or None, dict(expected.refs)
        stale = self.stale
        deadline = time.monotonic() + 2 * stale
        attempt = 0
        while True:
            new_refs = {**current, **{r: c for r, c in refs.items() if c is not None}}
            for r, c in refs.items():
                if c is None:
                    new_refs.pop(r, None)
            seq = _seq(head) + 1 if head else 0
            name = f"{seq:012d}-{secrets.token_hex(8)}"
            body = json.dumps({"format": 1, "seq": seq, "prev": head, "refs": new_refs}, sort_keys=True).encode()
            proposed = time.monotonic()
            self._batch(add=[(body, f"{self.layout.reflog}{name}.json")])
            listing = self._list(self.layout.reflog)
            entries, confirmed = self._log(listing)
            mine = entries.get(name)
            if mine is None:
                raise RemoteError(f"{self.url}: a ref update just written is not listed; the bucket's listing "
                                  "lags its writes, which wvc cannot push safely through")
            now = _time(mine.uploaded_at)
            rivals = [n for n in entries if n != name and _seq(n) >= seq
                      and (n in confirmed or now - _time(entries[n].uploaded_at) < stale)]
            # confirm only well within the staleness bound: a pusher paused past it could be
            # passed over by others, who would take its proposal for a crashed one's
            wait = 0.0
            if not rivals and time.monotonic() - proposed < stale / 2:
                landed, wait, ok_listed = self._confirm(name, mine)
                if landed is not None:
                    self.head = name
                    self._tidy(*landed, name, now, stale)
                    return
                retract = [f"{self.layout.reflog}{name}.json"]  # did not count (landed late, or not at all): withdrawn
                if ok_listed:
                    retract.insert(0, f"{self.layout.reflog}{name}.ok")
            else:
                retract = [f"{self.layout.reflog}{name}.json"]
            self._batch(delete=[self._key(p) for p in retract])
            attempt += 1
            if wait:  # rate-limited: wait what the bucket asked, and allow for it
                time.sleep(wait)
                deadline += wait
            time.sleep(random.uniform(0.02, 0.1) * min(2 ** attempt, 16))
            listing = self._list(self.layout.reflog)
            now_head = self._head(listing)
            if now_head != head:
                theirs = self._entry(now_head) if now_head else {}
                moved = [r for r in refs if theirs.get(r) != current.get(r)]
                if moved:
                    raise NonFastForward(f"{self.url}: another push moved {', '.join(sorted(moved))} first; pull, "
                                         "then push again")
                head, current = now_head, theirs
            if time.monotonic() > deadline:
                raise RemoteChanged(f"{self.url}: another push to this bucket is in progress (or a pusher crashed "
                                    f"in the last {stale:.0f} s); try again")

    def _confirm(self, name: str, mine) -> tuple[tuple[dict, set] | None, float, bool]:
        """Send the confirm of proposal ``name`` once, then list: ((entries, confirmed) of that
        listing if it landed and counts, else None; the seconds a rate limit asked to wait;
        whether its ``.ok`` is listed, counting or not).

        Never resent: a resend after a 429's Retry-After (the generic back-off) landed after
        the lease, when a rival had taken this proposal for a crashed pusher's and confirmed
        its own entry at the same seq; both pushes reported success. Whatever the request's
        fate (refused, failed, answered late), the listing after it says what counts."""
        wait = 0.0
        try:
            self._send_once({"type": "copyFile", "path": self._key(f"{self.layout.reflog}{name}.ok"), "xetHash": mine.xet_hash,
                             "mtime": int(time.time() * 1000), "sourceRepoType": "bucket",
                             "sourceRepoId": self.bucket_id})
        except RateLimited as exc:
            wait = exc.retry_after if exc.retry_after is not None else 1.0
        except (RemoteError, *_transport_errors()) as exc:  # (perhaps applied: the listing tells)
            log.debug("bucket %s: confirm answered %s; the next listing tells whether it landed", self.url, exc)
        listing = self._list(self.layout.reflog)
        entries, confirmed = self._log(listing)
        # (another counting entry at this seq or later cannot come of the protocol; if a
        # bucket holds one anyway, this one is withdrawn rather than doubled)
        alone = not any(n != name and _seq(n) >= _seq(name) for n in confirmed)
        return (((entries, confirmed) if name in confirmed and alone else None), min(wait, 60.0),
                f"{self.layout.reflog}{name}.ok" in listing)

    def _tidy(self, entries: dict, confirmed: set, head: str, now: float, stale: float) -> None:
        """Delete log entries no reader needs: confirmed ones far behind the head, and crashed
        pushers' stale proposals behind it. Best effort: a failure here loses nothing."""
        behind = sorted((n for n in confirmed if _order(n) < _order(head)), key=_order)
        drop = behind[:-KEEP_ENTRIES]
        drop += [n for n in entries if n not in confirmed and _order(n) < _order(head)
                 and now - _time(entries[n].uploaded_at) > stale]
        if not drop:
            return
        paths = [self._key(f"{self.layout.reflog}{n}.{ext}") for n in drop for ext in ("ok", "json")]
        try:
            self._batch(delete=paths)
        except RemoteError as exc:
            log.debug("bucket %s: old ref-log entries not deleted (%s); a later push deletes them", self.url, exc)
