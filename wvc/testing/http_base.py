"""What the local Hub server and its Xet CAS share: request plumbing, quotas and faults.

``BaseHandler`` routes a request to ``self._route``'s handler and turns a ``HubError`` into the
Hub's JSON error answer; the server (a ``CountingServer``) logs every request, enforces the
quota that ``quota_for`` names, and draws the injected read faults.
"""

from __future__ import annotations

import json
import math
import re
import socket
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Quota:
    """At most ``limit`` events in any ``window`` seconds (a sliding window)."""

    def __init__(self, limit: int, window: float):
        self.limit, self.window = limit, window
        self.times: list[float] = []
        self.rejected = 0
        self.peak = 0  # the most events ever admitted within one window

    def admit(self) -> float | None:
        """Record an event, or return how many seconds until one would be admitted."""
        now = time.monotonic()
        self.times = [t for t in self.times if now - t < self.window]
        if len(self.times) >= self.limit:
            self.rejected += 1
            return self.window - (now - self.times[0])
        self.times.append(now)
        self.peak = max(self.peak, len(self.times))
        return None


class HubError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None, *, commit: str | None = None,
                 retry_after: float | None = None):
        super().__init__(message)
        self.status, self.message, self.code = status, message, code
        self.commit, self.retry_after = commit, retry_after  # X-Repo-Commit; Retry-After (a 429)


class ReadFaults:
    """A seeded fault plan for read requests (see the module docstring)."""

    KINDS = ("500", "reset", "truncate", "garbage")

    def __init__(self, rate: float, kinds=KINDS, seed: int = 0):
        import random

        self.rate, self.kinds, self.random = rate, tuple(kinds), random.Random(seed)
        self.injected: dict[str, int] = {}

    def draw(self) -> str | None:
        if self.random.random() >= self.rate:
            return None
        kind = self.random.choice(self.kinds)
        self.injected[kind] = self.injected.get(kind, 0) + 1
        return kind


def match_route(routes, method: str, path: str):
    """(handler, groups) of the first (method, pattern, handler) route that matches, else None."""
    for m, pattern, fn in routes:
        match = re.fullmatch(pattern, path)
        if m == method and match:
            return fn, match.groups()
    return None


def tree_listing(paths, prefix: str, recursive: bool) -> tuple[list[str], list[str]]:
    """(files, directories) a tree listing of ``prefix`` shows: its direct children, or with
    ``recursive`` every file below and every folder on the way."""
    files, dirs = [], set()
    for path in sorted(paths):
        if prefix and not path.startswith(prefix + "/"):
            continue
        rest = path[len(prefix) + 1:] if prefix else path
        if "/" in rest and not recursive:
            dirs.add((prefix + "/" if prefix else "") + rest.split("/")[0])
            continue
        if recursive:
            parts = rest.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                dirs.add((prefix + "/" if prefix else "") + "/".join(parts[:i]))
        files.append(path)
    return files, sorted(dirs)


class BaseHandler(BaseHTTPRequestHandler):
    """Request plumbing shared by the Hub API and the Xet CAS: routing, errors, injected faults."""

    protocol_version = "HTTP/1.1"
    server: "CountingServer"
    # headers and body go out in two writes: without this, Nagle's algorithm holds the body
    # until the client's delayed ACK (40 ms a response), which no real server adds
    disable_nagle_algorithm = True

    def log_message(self, *args):  # quiet
        pass

    # -- plumbing ------------------------------------------------------------------------------
    _fault = None

    def _send(self, status: int, body: bytes = b"", headers: dict | None = None, head_only: bool = False):
        if self._fault == "garbage" and status == 200 and (headers or {}).get("Content-Type") == "application/json":
            body = b"\xff\xfe<html>Please sign in to the network</html>"
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, str(v))
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body and not head_only:
            if self._fault == "truncate" and len(body) > 1:
                self.wfile.write(body[: len(body) // 2])
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            self.wfile.write(body)

    def _json(self, status: int, obj, headers: dict | None = None, head_only: bool = False):
        self._send(status, json.dumps(obj).encode(), {"Content-Type": "application/json", **(headers or {})},
                   head_only=head_only)

    def _body(self) -> bytes:
        self._body_read = True
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = bytearray()
            while True:
                size = int(self.rfile.readline().strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    break
                out += self.rfile.read(size)
                self.rfile.readline()
            body = bytes(out)
        else:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.add_received(self.path.partition("?")[0], len(body))
        return body

    def _dispatch(self, method: str):
        raw_path, _, query = self.path.partition("?")
        params = urllib.parse.parse_qs(query)
        self._body_read = False
        try:
            self.server.count(method, raw_path)
            self.server.check_quota(*self.server.quota_for(raw_path))
            handler = self._route(method, raw_path)
            if handler is None:
                raise HubError(404, f"no route for {method} {raw_path}")
            self._fault = self.server.draw_read_fault() if method in ("GET", "HEAD") else None
            if self._fault == "500":
                raise HubError(500, "injected server error")
            if self._fault == "reset":
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            handler[0](*handler[1], params=params)
        except HubError as exc:
            if method in ("POST", "PUT") and not self._body_read:
                self._body()  # an unread body would be taken for the next request on this connection
            headers = {"X-Error-Code": exc.code} if exc.code else {}
            if getattr(exc, "retry_after", None) is not None:
                headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after)))  # whole seconds, as the Hub sends
            if exc.code == "EntryNotFound" and getattr(exc, "commit", None):
                headers["X-Repo-Commit"] = exc.commit
            # an answer to HEAD has no body: one would be read as the next response's start
            self._json(exc.status, {"error": exc.message}, headers, head_only=method == "HEAD")
        except (BrokenPipeError, ConnectionResetError):
            pass

    def do_GET(self):
        self._dispatch("GET")

    def do_HEAD(self):
        self._dispatch("HEAD")

    def do_POST(self):
        self._dispatch("POST")

    def do_PUT(self):
        self._dispatch("PUT")

    def do_DELETE(self):
        self._dispatch("DELETE")



class CountingServer(ThreadingHTTPServer):
    """A threading server that logs requests, counts bytes served and injects faults."""

    daemon_threads = True

    def __init__(self, address, handler):
        super().__init__(address, handler)
        self.fail: dict[str, int] = {}
        # tests: faults for bucket batches, taken in order by the first batch holding an
        # operation of that type: {"op": "copyFile", "status": 429, "retry_after": 3} refuses it,
        # {"op": "copyFile", "delay": 2.5} applies it late
        self.bucket_faults: list[dict] = []
        self.bucket_ops: list[tuple[str, str]] = []  # (type, path) of every bucket operation applied
        self.requests: list[tuple[str, str]] = []
        self.served_bytes = 0
        self.received_bytes: dict[str, int] = {}  # request body bytes by kind (see received_kind)
        self.on_request = None  # tests: called with (method, path) as each request arrives
        self.read_faults: ReadFaults | None = None
        self._lock = threading.Lock()

    @staticmethod
    def received_kind(path: str) -> str:
        """What an upload was, for measurements: a Xet xorb or shard, an LFS object, a Hub commit."""
        for marker, kind in (("/xorbs/", "xet-xorbs"), ("/shards", "xet-shards"), ("/upload/", "lfs-objects"),
                             ("/commit/", "commit"), ("/info/lfs/", "lfs-batch"), ("/preupload/", "preupload"),
                             ("/batch", "bucket-batch")):
            if marker in path:
                return kind
        return "other"

    def add_received(self, path: str, n: int) -> None:
        kind = self.received_kind(path)
        with self._lock:
            self.received_bytes[kind] = self.received_bytes.get(kind, 0) + n

    def quota_for(self, path: str) -> tuple["Quota | None", str]:
        return None, ""

    def draw_read_fault(self) -> str | None:
        if self.read_faults is None:
            return None
        with self._lock:
            return self.read_faults.draw()

    def check_quota(self, quota: Quota | None, message: str) -> None:
        if quota is None:
            return
        with self._lock:
            wait = quota.admit()
        if wait is not None:
            raise HubError(429, message, retry_after=wait)

    def count(self, method: str, path: str) -> None:
        with self._lock:
            self.requests.append((method, path))
        if self.on_request is not None:
            self.on_request(method, path)

    def add_served(self, n: int) -> None:
        with self._lock:
            self.served_bytes += n

    def take_bucket_fault(self, op_types: set[str]) -> dict | None:
        with self._lock:
            for k, fault in enumerate(self.bucket_faults):
                if fault.get("op") in op_types:
                    return self.bucket_faults.pop(k)
        return None

    def take_failure(self, what: str) -> bool:
        with self._lock:
            if self.fail.get(what, 0) > 0:
                self.fail[what] -= 1
                return True
            return False
