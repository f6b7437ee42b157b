"""The local Hub server's Xet CAS service, on a port of its own (as the Hub's is a host of its own).

Endpoints follow the Xet protocol's api.md: xorb upload (verified against its hash), shard
upload (verified: see xet_cas.py), reconstruction (v1 and v2, with ``Range``), batch
reconstruction, global dedup (always 404: this CAS shares nothing across repos), and the
transfer URLs the reconstruction hands out: signed, range-bound reads of xorbs. It also serves
the Hub's ``/resolve/`` redirect target for Xet-backed files (the "bridge"): a signed URL that
answers with the reconstructed bytes, with ``Range``. Tokens come from the Hub's
``xet-read-token`` / ``xet-write-token`` endpoints; a write token also reads.

Being on another origin matters: huggingface_hub follows a ``/resolve/`` redirect to the same
origin and reads the file's metadata from the last answer, but stops at a redirect to another
host and reads the Xet headers from the redirect itself, as it does against the real Hub.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
import threading
import time

from .http_base import BaseHandler, CountingServer, HubError, match_route
from .xet_format import XetFormatError

TOKEN_SECONDS = 3600


class CasHandler(BaseHandler):
    server: "CasServer"

    def _route(self, method: str, path: str):
        h = "([0-9a-f]{64})"
        routes = [
            ("POST", rf"/v1/xorbs/default/{h}", self.upload_xorb),
            ("POST", r"/v1/shards", self.upload_shard),
            ("POST", r"/v2/shards", self.upload_shard_v2),
            ("GET", rf"/v1/reconstructions/{h}", self.reconstruction),
            ("GET", rf"/v2/reconstructions/{h}", self.reconstruction_v2),
            ("POST", r"/v1/reconstructions", self.batch_reconstruction),
            ("GET", rf"/v1/chunks/(?:default|default-merkledb)/{h}", self.global_dedup),
            ("GET", rf"/transfer/xorbs/default/{h}", self.transfer),
            ("GET", rf"/bridge/{h}", self.bridge),
            ("HEAD", rf"/bridge/{h}", self.bridge),
        ]
        return match_route(routes, method, path)

    def _token(self, write: bool) -> bool:
        """Check the request's Xet token; whether its uploads must carry sha256 metadata."""
        got = self.headers.get("Authorization", "")
        grant = self.server.token_grant(got[len("Bearer "):] if got.startswith("Bearer ") else "")
        if grant is None:
            raise HubError(401, "missing, unknown or expired Xet token")
        if write and grant[0] != "write":
            raise HubError(403, "this Xet token has read scope; uploads need a write token")
        return grant[1]

    def _store(self):
        return self.server.hub.storage.xet

    # -- uploads -------------------------------------------------------------------------------
    def upload_xorb(self, xorb, params):
        body = self._body()
        self._token(write=True)
        if self.server.hub.take_failure("upload-429"):  # tests: a rate-limited upload
            raise HubError(429, "You have exceeded our API request rate limit", retry_after=1)
        try:
            inserted = self._store().put_xorb(xorb, body)
        except XetFormatError as exc:
            raise HubError(400, str(exc)) from exc
        self._json(200, {"was_inserted": inserted})

    def _shard(self) -> int:
        body = self._body()
        sha256_required = self._token(write=True)
        return self._store().put_shard(body, require_sha256=sha256_required)

    def upload_shard(self, params):
        try:
            result = self._shard()
        except XetFormatError as exc:
            raise HubError(400, f"shard rejected: {exc}") from exc
        self._json(200, {"result": 1 if result else 0})

    def upload_shard_v2(self, params):
        """The streamed form: 200 and newline-delimited events; the last one says how it
        ended ({"type": "result"}, or {"type": "error", ...}: the status is already 200)."""
        try:
            self._shard()
            frames = [{"type": "validating", "verified": 1, "total": 1}, {"type": "result"}]
        except XetFormatError as exc:
            frames = [{"type": "error", "message": f"shard rejected: {exc}", "retryable": False}]
        self._send(200, b"".join(json.dumps(f).encode() + b"\n" for f in frames),
                   {"Content-Type": "application/x-ndjson"})

    # -- reconstruction ------------------------------------------------------------------------
    def _reconstruction(self, file_id: str, v2: bool) -> None:
        self._token(write=False)
        store = self._store()
        record = store.file_record(file_id)
        if record is None:
            raise HubError(404, f"file {file_id} not found")
        rng = None
        header = self.headers.get("Range")
        if header:
            m = re.fullmatch(r"bytes=(\d+)-(\d*)", header.strip())
            if not m:
                raise HubError(400, f"bad Range {header!r}")
            first = int(m.group(1))
            last = min(int(m.group(2)), record["size"] - 1) if m.group(2) else record["size"] - 1
            if first >= record["size"] or last < first:
                raise HubError(416, f"range {header} is outside a file of {record['size']} bytes")
            rng = (first, last)
        answer = store.reconstruction(file_id, rng, self.server.base_url, v2=v2)
        for entries in answer["xorbs" if v2 else "fetch_info"].values():
            for e in entries:
                lo, hi = (e["ranges"][0]["bytes"] if v2 else e["url_range"]).values()
                e["url"] = self.server.sign(e["url"], lo, hi)
        self._json(200, answer)

    def reconstruction(self, file_id, params):
        self._reconstruction(file_id, v2=False)

    def reconstruction_v2(self, file_id, params):
        self._reconstruction(file_id, v2=True)

    def batch_reconstruction(self, params):
        keys = json.loads(self._body() or b"[]")
        self._token(write=False)
        store, files, fetch = self._store(), {}, {}
        for key in keys:
            file_id = key.get("hash", "") if isinstance(key, dict) else ""
            if not re.fullmatch(r"[0-9a-f]{64}", file_id) or store.file_record(file_id) is None:
                continue
            answer = store.reconstruction(file_id, None, self.server.base_url)
            files[file_id] = answer["terms"]
            for xorb, entries in answer["fetch_info"].items():
                for e in entries:
                    e["url"] = self.server.sign(e["url"], *e["url_range"].values())
                fetch.setdefault(xorb, []).extend(entries)
        self._json(200, {"files": files, "fetch_info": fetch})

    def global_dedup(self, chunk, params):
        self._token(write=False)
        raise HubError(404, "chunk not known to global deduplication")

    # -- signed reads --------------------------------------------------------------------------
    def _ranged(self, size: int, signed: tuple[int, int] | None) -> tuple[int, int, int]:
        """(first, last, status) for this request's Range within ``size`` bytes; a signed
        transfer URL must be read with a Range inside what was signed."""
        header = self.headers.get("Range")
        if not header:
            if signed is not None:
                raise HubError(403, "a transfer URL must be read with the Range it was issued for")
            return 0, size - 1, 200
        m = re.fullmatch(r"bytes=(\d*)-(\d*)", header.strip())
        if not m or not (m.group(1) or m.group(2)):
            raise HubError(416, f"bad Range {header!r}")
        if m.group(1):
            first = int(m.group(1))
            last = min(int(m.group(2)), size - 1) if m.group(2) else size - 1
        else:
            first, last = max(0, size - int(m.group(2))), size - 1
        if first >= size or last < first:
            raise HubError(416, f"range {header} is outside {size} bytes")
        if signed is not None and not (signed[0] <= first and last <= signed[1]):
            raise HubError(403, "the Range is outside what this URL was signed for")
        return first, last, 206

    def transfer(self, xorb, params):
        lo, hi = (int(v) for v in params.get("range", ["0-0"])[0].split("-", 1))
        if not self.server.verify(f"/transfer/xorbs/default/{xorb}", lo, hi, params.get("sig", [""])[0]):
            raise HubError(403, "bad or missing signature")
        store = self._store()
        if store.xorb_chunks(xorb) is None:
            raise HubError(404, f"xorb {xorb} not found")
        size = store.xorb_path(xorb).stat().st_size
        first, last, status = self._ranged(size, (lo, hi))
        body = store.read_xorb(xorb, first, last)
        self.server.hub.add_served(len(body))
        self._send(status, body, {"Content-Type": "application/octet-stream",
                                  "Content-Range": f"bytes {first}-{last}/{size}"})

    def bridge(self, file_id, params):
        if not self.server.verify(f"/bridge/{file_id}", 0, 0, params.get("sig", [""])[0]):
            raise HubError(403, "bad or missing signature")
        record = self._store().file_record(file_id)
        if record is None:
            raise HubError(404, f"file {file_id} not found")
        size = record["size"]
        headers = {"Content-Type": "application/octet-stream", "Accept-Ranges": "bytes",
                   "ETag": f'"{record["sha256"]}"'}
        if size == 0:
            self._send(200, b"", headers, head_only=self.command == "HEAD")
            return
        first, last, status = (0, size - 1, 200) if self.server.hub.ignore_range else self._ranged(size, None)
        if status == 206:
            headers["Content-Range"] = f"bytes {first}-{last}/{size}"
        if self.command == "HEAD":
            self.send_response(status)
            for k, v in {**headers, "Content-Length": last - first + 1}.items():
                self.send_header(k, str(v))
            self.end_headers()
            return
        with open(self.server.hub.storage.blob_path(record["sha256"]), "rb") as fh:
            fh.seek(first)
            body = fh.read(last - first + 1)
        self.server.hub.add_served(len(body))
        self._send(status, body, headers)


class CasServer(CountingServer):
    """The CAS service beside a HubServer (``hub``): its requests, failures and quota are the hub's."""

    def __init__(self, hub, host: str):
        super().__init__((host, 0), CasHandler)
        self.hub = hub
        self.base_url = f"http://{host}:{self.server_address[1]}"
        self.tokens: dict[str, tuple[str, float, bool]] = {}
        self._secret = secrets.token_bytes(32)
        self._token_lock = threading.Lock()

    def quota_for(self, path: str):
        return self.hub.cas_quota, "You have exceeded the Xet service's request rate limit"

    def draw_read_fault(self) -> str | None:
        return self.hub.draw_read_fault()

    def count(self, method: str, path: str) -> None:
        self.hub.count(method, "[cas]" + path)

    def add_received(self, path: str, n: int) -> None:
        self.hub.add_received(path, n)

    def issue_token(self, scope: str, sha256_required: bool = True) -> tuple[str, int]:
        """A token for ``scope`` ("read" or "write"); a repository's uploads must carry each
        file's sha256 (its commit names files by it), a bucket's need not."""
        token, expires = "xet_" + secrets.token_urlsafe(24), int(time.time()) + TOKEN_SECONDS
        with self._token_lock:
            self.tokens[token] = (scope, expires, sha256_required)
        return token, expires

    def token_answer(self, scope: str, sha256_required: bool = True) -> tuple[dict, dict]:
        """A new token as the Hub's ``xet-*-token`` endpoints answer it (auth.md): the JSON body,
        and the headers huggingface_hub reads."""
        token, expires = self.issue_token(scope, sha256_required)
        return ({"accessToken": token, "exp": expires, "casUrl": self.base_url},
                {"X-Xet-Cas-Url": self.base_url, "X-Xet-Access-Token": token, "X-Xet-Token-Expiration": expires})

    def redirect_headers(self, xet_hash: str, token_route: str) -> dict:
        """How the Hub answers ``/resolve/`` of a Xet-backed file: a redirect to a signed URL
        on this other origin that serves the reconstructed bytes (Range too), with the file's
        Xet hash and where a read token for it comes from."""
        return {"Location": self.sign(f"{self.base_url}/bridge/{xet_hash}"), "X-Xet-Hash": xet_hash,
                "X-Xet-Refresh-Route": token_route, "Link": f'<{token_route}>; rel="xet-auth"'}

    def token_grant(self, token: str) -> tuple[str, bool] | None:
        with self._token_lock:
            scope, expires, sha256_required = self.tokens.get(token, (None, 0, True))
        return (scope, sha256_required) if expires > time.time() else None

    def _signature(self, path: str, lo: int, hi: int) -> str:
        return hmac.new(self._secret, f"{path}:{lo}-{hi}".encode(), hashlib.sha256).hexdigest()[:32]

    def sign(self, url: str, lo: int = 0, hi: int = 0) -> str:
        path = url[len(self.base_url):]
        query = f"range={lo}-{hi}&" if path.startswith("/transfer/") else ""
        return f"{url}?{query}sig={self._signature(path, lo, hi)}"

    def verify(self, path: str, lo: int, hi: int, sig: str) -> bool:
        return hmac.compare_digest(self._signature(path, lo, hi), sig)
