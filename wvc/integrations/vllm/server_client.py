"""A trainer's side of a vLLM server running the ``wvc`` backend: vLLM's own routes, over
HTTP, with commit ids (transfer.py is the server's side). Standard library only: a trainer
needs neither vLLM nor an HTTP package to drive one.

    server = VllmServer("http://vllm-0:8000")
    server.init("hf://buckets/team/runs", "main", commit=start)
    server.load(commit)          # start, update, finish: the server then reports ``commit``

Transient failures (the server not reachable yet, a connection reset, 429/502/503/504) are
retried with back-off until the call's deadline; any other answer is a ServerError carrying
the server's own message: the update was refused (the engine keeps the version it had) or
the engine was marked unusable (the message says so). Either way the server never serves a
mix of two versions: the backend fetches a whole version before it writes any of it.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import threading
import time
import urllib.parse

from ...errors import WvcError

RETRIED_STATUS = {429, 502, 503, 504}
BACKOFF = (0.25, 5.0)  # first and longest wait between tries, seconds
MAX_ANSWER = 1 << 20  # a route's answer is small JSON; more is refused unread


class ServerError(WvcError):
    """A vLLM server refused a call, or could not be reached before the deadline."""

    def __init__(self, url: str, message: str, *, status: int | None = None):
        super().__init__(f"{url}: {message}")
        self.url, self.status, self.reason = url, status, message


class VllmServer:
    def __init__(self, url: str, timeout: float = 1800.0, api_key: str | None = None):
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise WvcError(f"not a server URL: {url!r} (http://host:port)")
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.api_key = api_key  # the server's --api-key: sent with every call (plugin.WEIGHT_ROUTES need it)

    # -- the routes ----------------------------------------------------------------------
    def init(self, remote: str, branch: str, commit: str | None, *, timeout: float | None = None) -> None:
        """``/init_weight_transfer_engine``: follow ``branch`` of ``remote``; ``commit``: the
        version the server was started from (checked against its files), or None."""
        info = {"remote": remote, "branch": branch}
        if commit is not None:
            info["commit"] = commit
        self.call("POST", "/init_weight_transfer_engine", {"init_info": info}, timeout=timeout)

    def load(self, commit: str, *, timeout: float | None = None) -> str:
        """Move the server to ``commit`` (its followers fetch it, then write it in); the
        version it reports after, checked to be ``commit``."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        self.call("POST", "/start_weight_update", {}, deadline=deadline)
        self.call("POST", "/update_weights", {"update_info": {"commit": commit}}, deadline=deadline)
        self.call("POST", "/finish_weight_update", {"weight_version": commit}, deadline=deadline)
        held = self.weight_version(timeout=max(1.0, deadline - time.monotonic()))
        if held != commit:
            raise ServerError(self.url, f"reports version {held} after loading {commit}")
        return held

    def weight_version(self, *, timeout: float | None = None) -> str | None:
        return self.call("GET", "/weight_info", timeout=timeout).get("weight_version")

    def pause(self, *, timeout: float | None = None) -> None:
        """In-flight requests held (``mode=keep``, as TRL's client asks) and caches cleared."""
        self.call("POST", "/pause?mode=keep", {}, timeout=timeout)

    def resume(self, *, timeout: float | None = None) -> None:
        self.call("POST", "/resume", {}, timeout=timeout)

    # -- HTTP ----------------------------------------------------------------------------
    def call(self, method: str, route: str, body: dict | None = None, *, timeout: float | None = None,
             deadline: float | None = None) -> dict:
        """One route, retried on transient failures until ``deadline`` (or ``timeout`` from
        now), a total deadline: a server that answers a byte at a time is cut off at it; its
        JSON answer (a dict)."""
        if deadline is None:
            deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        wait = BACKOFF[0]
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ServerError(self.url, f"{method} {route}: no answer before the deadline")
            try:
                status, raw = _exchange(method, self.url + route, data, headers, left)
                if 200 <= status < 300:
                    return _json(raw)
                if status not in RETRIED_STATUS:
                    raise ServerError(self.url, f"{method} {route}: {_reason(status, raw)}", status=status)
                problem = f"HTTP {status}"
            except (http.client.HTTPException, ConnectionError, TimeoutError, OSError) as exc:
                problem = "no answer before the deadline" if time.monotonic() >= deadline else _clean(str(exc))
            if time.monotonic() + wait >= deadline:
                raise ServerError(self.url, f"{method} {route}: {problem} (retried until the deadline)")
            time.sleep(wait)  # (a server restarting or busy: nothing to wait on but time)
            wait = min(wait * 2, BACKOFF[1])


def _exchange(method: str, url: str, data: bytes | None, headers: dict, seconds: float) -> tuple[int, bytes]:
    """One HTTP request: (status, at most MAX_ANSWER + 1 bytes of the answer), within
    ``seconds`` in all. A socket timeout bounds each read only, so a watchdog shuts the
    connection at the deadline (the blocked read then fails)."""
    parts = urllib.parse.urlsplit(url)
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = kind(parts.hostname, parts.port, timeout=seconds)
    expired = threading.Event()

    def cut_off():
        expired.set()
        sock = conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    answered = threading.Event()
    threading.Thread(target=lambda: answered.wait(seconds) or cut_off(), daemon=True).start()
    try:
        conn.request(method, parts.path + (f"?{parts.query}" if parts.query else ""), body=data, headers=headers)
        answer = conn.getresponse()
        raw = answer.read(MAX_ANSWER + 1)
        if expired.is_set():
            raise TimeoutError("no answer before the deadline")
        return answer.status, raw
    except (http.client.HTTPException, OSError):
        if expired.is_set():
            raise TimeoutError("no answer before the deadline") from None
        raise
    finally:
        answered.set()
        conn.close()


def _json(raw: bytes) -> dict:
    if len(raw) > MAX_ANSWER:
        raise WvcError("a vLLM route answered more than 1 MiB")
    if not raw.strip():
        return {}
    try:
        out = json.loads(raw)
    except ValueError:
        return {}
    return out if isinstance(out, dict) else {}


MAX_REASON = 300  # characters of a server's own message kept in an error


def _clean(text: str) -> str:
    """A server's text as one short printable line: terminal escapes and control characters
    dropped, whitespace runs made one space, at most MAX_REASON characters."""
    text = re.sub(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-_]", "", text)
    text = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 3] + "..."


def _reason(status: int, raw: bytes) -> str:
    """The server's own message (vLLM answers errors as JSON: ``{"error": {"message": ...}}``
    or FastAPI's ``{"detail": ...}``), else the status, made one short printable line."""
    body = _json(raw) if len(raw) <= MAX_ANSWER else {}
    for key in ("error", "detail", "message"):
        value = body.get(key)
        if isinstance(value, dict):
            value = value.get("message") or json.dumps(value)[:500]
        if value:
            return _clean(str(value))
    return f"HTTP {status}"
