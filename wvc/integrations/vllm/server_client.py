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

import json
import time
import urllib.error
import urllib.parse
import urllib.request

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
        now); its JSON answer (a dict)."""
        if deadline is None:
            deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        data = None if body is None else json.dumps(body).encode()
        wait = BACKOFF[0]
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ServerError(self.url, f"{method} {route}: no answer before the deadline")
            headers = {"Content-Type": "application/json"}
            if self.api_key:
                headers["Authorization"] = f"Bearer {self.api_key}"
            request = urllib.request.Request(self.url + route, data=data, method=method, headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=left) as answer:
                    return _json(answer.read(MAX_ANSWER + 1))
            except urllib.error.HTTPError as exc:
                if exc.code not in RETRIED_STATUS:
                    raise ServerError(self.url, f"{method} {route}: {_reason(exc)}", status=exc.code) from None
                problem = f"HTTP {exc.code}"
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as exc:
                problem = str(getattr(exc, "reason", exc))
            if time.monotonic() + wait >= deadline:
                raise ServerError(self.url, f"{method} {route}: {problem} (retried until the deadline)")
            time.sleep(wait)  # (a server restarting or busy: nothing to wait on but time)
            wait = min(wait * 2, BACKOFF[1])


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


def _reason(exc: urllib.error.HTTPError) -> str:
    """The server's own message (vLLM answers errors as JSON: ``{"error": {"message": ...}}``
    or FastAPI's ``{"detail": ...}``), else the status line."""
    try:
        body = json.loads(exc.read(MAX_ANSWER) or b"{}")
    except (ValueError, OSError):
        body = {}
    if isinstance(body, dict):
        for key in ("error", "detail", "message"):
            value = body.get(key)
            if isinstance(value, dict):
                value = value.get("message") or json.dumps(value)[:500]
            if value:
                return str(value)[:2000]
    return f"HTTP {exc.code} {exc.reason}"
