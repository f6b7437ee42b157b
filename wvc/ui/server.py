"""``wvc ui``: the views of ui/pages.py served on 127.0.0.1, read-only.

The server binds to loopback only, answers GET (and HEAD) and nothing else, sends pages
that may run no script and load nothing from elsewhere (a Content-Security-Policy of
``default-src 'none'``), and never writes: the change numbers the views need are computed
before it starts serving (ops/changes.py). Requests are answered one at a time (one
repository handle).

Only the user's own page loads are answered: a ``Host`` that names the loopback address or
``localhost`` on the serving port (any other is DNS rebinding: a page of another site whose
name now resolves to 127.0.0.1 would read every view), and no request a browser marks as
coming from another site or origin (``Sec-Fetch-Site`` other than ``same-origin`` or ``none``,
an ``Origin`` other than ours): 403. A view of a remote (``wvc ui URL``) reads a lazy copy,
whose chunks a view fetches into the user's cache as it needs them: the one write a request
can cause, and only a request of the user's own pages."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from ..errors import InvalidArgument, WvcError
from ..progress import NULL
from ..store.refs import HEADS
from . import data, pages

MAX_FIELDS = 50  # query fields a request may have (no view takes more than a few)
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; form-action 'self'"


def prepare(repo, revs=None, limit: int = data.DEFAULT_LIMIT, progress=NULL) -> int:
    """Compute the change numbers of each branch's (or each of ``revs``') last ``limit``
    first-parent commits; refuses a history with no tensor at all. Returns how many commits
    were computed now."""
    revs = revs or [HEADS + b for b in repo.branches()] or ["HEAD"]
    commits: list[str] = []
    for rev in revs:
        commits += [c for c in data.commits_of(repo, rev, limit) if c not in commits]
    if not any(f.tensors for c in commits for f in repo.tree_of(c, weights=False).files):
        raise InvalidArgument("no version here holds a tensor (no safetensors files): nothing to show")
    return repo.compute_tensor_changes(commits, progress)


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, repo, port: int = 0, name: str = ""):
        self.repo, self.name, self.lock = repo, name or repo.root.name, threading.Lock()
        try:
            super().__init__(("127.0.0.1", port), _Handler)
        except OSError as exc:
            raise InvalidArgument(f"cannot listen on 127.0.0.1:{port} ({exc.strerror or exc}): pick another --port")\
                from exc

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/"

    def start(self) -> "Server":
        threading.Thread(target=self.serve_forever, daemon=True).start()
        return self

    def handle_error(self, request, client_address):
        """A client that hangs up early is no error of ours: nothing on the terminal. Anything
        else is one line, never a traceback (the page the client gets is its own business)."""
        import sys

        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):
            return
        print(f"wvc ui: a request from {client_address[0]} failed: {type(exc).__name__}: {exc}", file=sys.stderr)


class _Handler(BaseHTTPRequestHandler):
    server: Server

    def log_message(self, *args):  # quiet: the CLI prints the address once
        pass

    def _send(self, status: int, body: str) -> None:
        payload = body.encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Security-Policy", CSP)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    def _from_elsewhere(self) -> str | None:
        """Why this request is not the user's own page load, or None."""
        port = self.server.server_address[1]
        ours = {f"127.0.0.1:{port}", f"localhost:{port}"}
        host = (self.headers.get("Host") or "").strip().lower()
        if host not in ours:
            return "this view answers only requests for 127.0.0.1 or localhost on its own port"
        site = (self.headers.get("Sec-Fetch-Site") or "").strip().lower()
        if site and site not in ("same-origin", "none"):
            return "this view answers no request from another site"
        origin = self.headers.get("Origin")
        if origin is not None and origin.strip().lower() not in {f"http://{h}" for h in ours}:
            return "this view answers no request from another origin"
        return None

    def do_GET(self):
        refused = self._from_elsewhere()
        if refused is not None:
            return self._send(403, pages.page("Refused", f"<p>{pages._e(refused)}</p>", self.server.name))
        url = urlsplit(self.path)
        view = pages.ROUTES.get(url.path)
        if view is None:
            return self._send(404, pages.page("Not found", "<p>No such view.</p>", self.server.name))
        try:
            query = parse_qs(url.query, max_num_fields=MAX_FIELDS)
            with self.server.lock:
                title, body = view(self.server.repo, query)
            self._send(200, pages.page(title, body, self.server.name))
        except (WvcError, KeyError, ValueError) as exc:
            message = str(exc) if isinstance(exc, WvcError) else f"bad request ({type(exc).__name__}: {exc})"
            self._send(400, pages.page("Cannot show this", f'<p class="error">{pages._e(message)}</p>',
                                       self.server.name))

    do_HEAD = do_GET

    def _refuse(self):
        self.send_response(405)
        self.send_header("Allow", "GET, HEAD")
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_POST = do_PUT = do_DELETE = do_PATCH = _refuse
