"""A local Hugging Face Hub-compatible server, for tests and offline CI.

    python -m wvc.testing.hub --port 8765 --root /tmp/hub [--token SECRET]

The real, unmodified huggingface_hub and hf_xet clients talk to it with
``HF_ENDPOINT=http://127.0.0.1:8765``. It speaks Xet as the Hub does (xet_server.py: token
endpoints here, a CAS service on a port of its own, ``/resolve/`` of a Xet-backed file
redirected there) and LFS for clients with ``HF_HUB_DISABLE_XET=1``. It keeps repos as
git-like commits (a 40-hex sha per commit, branches, ``parent_commit`` checked with 412)
and serves files with Range support. Endpoints follow shared/research/hub-protocol.md.

``fail`` injects failures for tests: {"commit": 1} answers the next commit with 403.
``served_bytes`` counts body bytes sent by resolve (downloads).
``read_faults`` (off by default): ``ReadFaults(rate, kinds, seed)`` answers that fraction of
GET and HEAD requests with a transient fault of one of ``kinds``: "500" (an error answer),
"reset" (the connection dropped before an answer), "truncate" (a body cut off half-way,
with the full Content-Length), "garbage" (200 with a body that is not JSON, as a captive
portal or a misconfigured proxy answers), the faults real networks and CDNs produce.
``request_quota`` / ``commit_quota`` (off by default): ``Quota(limit, window_seconds)``, the
Hub's own limits in miniature (about 1000 API requests per 5 minutes per user; commits per
hour per repo): over it, 429 with the Hub's wording and a Retry-After header.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import re
import threading
import time
import urllib.parse
from collections.abc import Mapping
from pathlib import Path

from .http_base import (BaseHandler, CountingServer, HubError, Quota, ReadFaults,  # noqa: F401 - Quota, ReadFaults: for tests
                        match_route, tree_listing)
from .hub_buckets import BucketRoutes, BucketStore
from .xet_cas import XetStore
from .xet_server import CasServer

TYPES = {"models": "", "datasets": "datasets/", "spaces": "spaces/"}


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()



class Commits(Mapping):
    """A repo's commits by sha: a file each, read once (commits never change). A repo's JSON
    holding every commit, read and written whole on every request, made each request cost
    what the history holds: a push took 3.6x as long after 1,000 pushes as after 100, all of
    it in this server (a benchmark measures the client)."""

    def __init__(self, folder: Path, cache: dict):
        self.folder, self.cache = folder, cache

    def __getitem__(self, sha: str) -> dict:
        if sha not in self.cache:
            path = self.folder / f"{sha}.json"
            if not re.fullmatch(r"[0-9a-f]{40}", sha) or not path.is_file():
                raise KeyError(sha)
            self.cache[sha] = json.loads(path.read_text())
        return self.cache[sha]

    def __setitem__(self, sha: str, commit: dict) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = self.folder / f"{sha}.tmp"
        tmp.write_text(json.dumps(commit))
        tmp.replace(self.folder / f"{sha}.json")
        self.cache[sha] = commit

    def __contains__(self, sha) -> bool:
        try:
            self[sha]
        except KeyError:
            return False
        return True

    def __iter__(self):
        return (p.stem for p in self.folder.glob("*.json"))

    def __len__(self) -> int:
        return sum(1 for _ in self)


class Storage:
    """Repos in ``root``: a JSON of refs and settings per repo, a file per commit, blobs by sha256."""

    def __init__(self, root: Path):
        self.root = Path(root)
        (self.root / "blobs").mkdir(parents=True, exist_ok=True)
        self.lock = threading.RLock()
        self.xet = XetStore(self.root, self.put_blob)
        self._commit_cache: dict[Path, dict] = {}

    def _meta_path(self, kind: str, repo: str) -> Path:
        return self.root / "repos" / kind / (repo.replace("/", "--") + ".json")

    def _commits(self, kind: str, repo: str) -> Commits:
        folder = self._meta_path(kind, repo).with_suffix(".commits")
        with self.lock:
            return Commits(folder, self._commit_cache.setdefault(folder, {}))

    def load(self, kind: str, repo: str) -> dict:
        """The repo's refs and settings, and its ``commits`` (a :class:`Commits`)."""
        path = self._meta_path(kind, repo)
        if not path.is_file():
            raise HubError(404, f"Repository {repo} not found", "RepoNotFound")
        meta = json.loads(path.read_text())
        meta["commits"] = self._commits(kind, repo)
        return meta

    def save(self, kind: str, repo: str, meta: dict) -> None:
        """The refs and settings (commits set on a :class:`Commits` are written as they are set;
        a plain dict's, a new repo's, are written here)."""
        path = self._meta_path(kind, repo)
        path.parent.mkdir(parents=True, exist_ok=True)
        commits = meta.get("commits")
        if commits is not None and not isinstance(commits, Commits):
            stored = self._commits(kind, repo)
            for sha, commit in commits.items():
                stored[sha] = commit
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({k: v for k, v in meta.items() if k != "commits"}))
        tmp.replace(path)

    def blob_path(self, sha256: str) -> Path:
        return self.root / "blobs" / sha256

    def put_blob(self, data: bytes) -> dict:
        sha = hashlib.sha256(data).hexdigest()
        path = self.blob_path(sha)
        if not path.exists():
            tmp = path.with_suffix(f".{threading.get_ident()}.tmp")
            tmp.write_bytes(data)
            tmp.replace(path)
        return {"sha256": sha, "size": len(data), "oid": git_blob_sha1(data)}

    def set_gated(self, kind: str, repo: str, allowed_tokens: list[str]) -> None:
        """Gate a repo like a Hub model with an access form: files only for ``allowed_tokens``."""
        with self.lock:
            meta = self.load(kind, repo)
            meta["gated"] = list(allowed_tokens)
            self.save(kind, repo, meta)

    def create(self, kind: str, repo: str, private: bool) -> bool:
        with self.lock:
            if self._meta_path(kind, repo).is_file():
                return False
            attrs = self.put_blob(b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n")
            sha = hashlib.sha1(f"{repo} init {time.time_ns()}".encode()).hexdigest()
            self.save(kind, repo, {
                "private": private, "branches": {"main": sha}, "tags": {},
                "commits": {sha: {"parent": None, "files": {".gitattributes": attrs}, "title": "initial commit",
                                  "message": "", "date": time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())}},
            })
            return True


def resolve_rev(meta: dict, rev: str) -> str:
    rev = urllib.parse.unquote(rev)
    if rev in meta["branches"]:
        return meta["branches"][rev]
    if rev in meta["tags"]:
        return meta["tags"][rev]
    if re.fullmatch(r"[0-9a-f]{40}", rev) and rev in meta["commits"]:
        return rev
    raise HubError(404, f"Invalid rev id: {rev}", "RevisionNotFound")



class Handler(BucketRoutes, BaseHandler):
    server: "HubServer"

    def _auth(self, meta: dict | None, write: bool) -> None:
        token = self.server.token
        if token is None:
            return
        got = self.headers.get("Authorization", "")
        if got != f"Bearer {token}":
            if write or (meta and meta.get("private")) or meta is None:
                raise HubError(401, "Invalid credentials in Authorization header")

    def _route(self, method: str, path: str):
        t = "(models|datasets|spaces)"
        repo = r"([^/]+/[^/]+)"
        routes = self.bucket_routes() + [
            ("POST", r"/api/repos/create", self.create_repo),
            ("POST", r"/api/validate-yaml", self.validate_yaml),
            ("GET", r"/api/agent-harnesses", self.telemetry),
            ("GET", rf"/api/{t}/{repo}/tree/([^/]+)(?:/(.*))?", self.tree),
            ("POST", rf"/api/{t}/{repo}/paths-info/([^/]+)", self.paths_info),
            ("GET", rf"/api/{t}/{repo}/refs", self.refs),
            ("GET", rf"/api/{t}/{repo}/commits/([^/]+)", self.commits),
            ("POST", rf"/api/{t}/{repo}/preupload/([^/]+)", self.preupload),
            ("GET", rf"/api/{t}/{repo}/xet-(read|write)-token/([^/]+)", self.xet_token),
            ("POST", rf"/api/{t}/{repo}/commit/([^/]+)", self.commit),
            ("POST", rf"/api/{t}/{repo}/branch/([^/]+)", self.create_branch),
            ("DELETE", rf"/api/{t}/{repo}/branch/([^/]+)", self.delete_branch),
            ("GET", rf"/api/{t}/{repo}/revision/([^/]+)", self.info),
            ("GET", rf"/api/{t}/{repo}", self.info),
            ("POST", r"/(?:(datasets|spaces)/)?([^/]+/[^/]+)\.git/info/lfs/objects/batch", self.lfs_batch),
            ("PUT", r"/upload/([0-9a-f]{64})", self.upload),
            ("GET", r"/(?:(datasets|spaces)/)?([^/]+/[^/]+)/resolve/([^/]+)/(.+)", self.resolve),
            ("HEAD", r"/(?:(datasets|spaces)/)?([^/]+/[^/]+)/resolve/([^/]+)/(.+)", self.resolve),
        ]
        return match_route(routes, method, path)

    # -- endpoints -----------------------------------------------------------------------------
    def telemetry(self, params):
        self._json(200, {})

    def validate_yaml(self, params):
        self._body()
        self._json(200, {})

    def create_repo(self, params):
        body = json.loads(self._body() or b"{}")
        self._auth(None, write=True)
        kind = (body.get("type") or "model") + "s"
        name = f"{body.get('organization') or 'user'}/{body['name']}"
        private = body.get("private", body.get("visibility", "private") == "private")
        created = self.server.storage.create(kind, name, bool(private))
        url = {"url": f"{self.server.base_url}/{TYPES[kind]}{name}"}
        self._json(200 if created else 409, url if created else {**url, "error": "You already created this repo"})

    def _meta(self, kind, repo, write=False):
        meta = self.server.storage.load(kind, urllib.parse.unquote(repo))
        self._auth(meta, write)
        return meta

    def info(self, kind, repo, rev=None, params=None):
        meta = self._meta(kind, repo)
        sha = resolve_rev(meta, rev or "main")
        files = meta["commits"][sha]["files"]
        self._json(200, {"id": urllib.parse.unquote(repo), "sha": sha, "private": meta["private"],
                         "lastModified": meta["commits"][sha]["date"],
                         "siblings": [{"rfilename": p} for p in sorted(files)]})

    def _entries(self, files: dict, prefix: str, recursive: bool) -> list[dict]:
        paths, dirs = tree_listing(files, prefix, recursive)
        return [self._file_entry(p, files[p]) for p in paths] + \
            [{"type": "directory", "oid": hashlib.sha1(d.encode()).hexdigest(), "size": 0, "path": d} for d in dirs]

    @staticmethod
    def _file_entry(path: str, f: dict) -> dict:
        entry = {"type": "file", "oid": f["oid"], "size": f["size"], "path": path}
        if f.get("xet"):
            entry["xetHash"] = f["xet"]
        if f.get("lfs"):
            entry["lfs"] = {"oid": f["sha256"], "size": f["size"], "pointerSize": 134}
        return entry

    def xet_token(self, kind, repo, scope, rev, params):
        """A Xet access token for this repo (auth.md), in the JSON body and in the headers
        huggingface_hub reads."""
        if not self.server.speaks_xet:  # an LFS-only server, as this one was before it spoke Xet
            raise HubError(404, f"no route for GET {self.path}")
        meta = self._meta(kind, repo, write=scope == "write")
        if scope == "read":
            resolve_rev(meta, rev)
        self._json(200, *self.server.cas.token_answer(scope))

    def tree(self, kind, repo, rev, sub, params):
        meta = self._meta(kind, repo)
        sha = resolve_rev(meta, rev)
        files = meta["commits"][sha]["files"]
        sub = urllib.parse.unquote(sub or "").strip("/")
        if sub and not any(p.startswith(sub + "/") for p in files):
            err = HubError(404, f"Entry not found: {sub}", "EntryNotFound")
            raise err
        recursive = params.get("recursive", ["false"])[0].lower() == "true"
        self._json(200, self._entries(files, sub, recursive))

    def paths_info(self, kind, repo, rev, params):
        form = urllib.parse.parse_qs(self._body().decode())
        meta = self._meta(kind, repo)
        files = meta["commits"][resolve_rev(meta, rev)]["files"]
        self._json(200, [self._file_entry(p, files[p]) for p in form.get("paths", []) if p in files])

    def refs(self, kind, repo, params):
        meta = self._meta(kind, repo)
        out = {"branches": [{"name": b, "ref": f"refs/heads/{b}", "targetCommit": s} for b, s in meta["branches"].items()],
               "converts": [], "tags": [{"name": t, "ref": f"refs/tags/{t}", "targetCommit": s} for t, s in meta["tags"].items()]}
        if "include_prs" in params:
            out["pullRequests"] = []
        self._json(200, out)

    def commits(self, kind, repo, rev, params):
        meta = self._meta(kind, repo)
        sha, out = resolve_rev(meta, rev), []
        while sha:
            c = meta["commits"][sha]
            out.append({"id": sha, "title": c["title"], "message": c["message"], "date": c["date"], "authors": [{"user": "wvc"}]})
            sha = c["parent"]
        self._json(200, out)

    def create_branch(self, kind, repo, branch, params):
        body = json.loads(self._body() or b"{}")
        with self.server.storage.lock:
            meta = self._meta(kind, repo, write=True)
            branch = urllib.parse.unquote(branch)
            if branch in meta["branches"]:
                raise HubError(409, f"Branch {branch} already exists")
            meta["branches"][branch] = resolve_rev(meta, body.get("startingPoint") or "main")
            self.server.storage.save(kind, urllib.parse.unquote(repo), meta)
        self._json(200, {})

    def delete_branch(self, kind, repo, branch, params):
        with self.server.storage.lock:
            meta = self._meta(kind, repo, write=True)
            meta["branches"].pop(urllib.parse.unquote(branch), None)
            self.server.storage.save(kind, urllib.parse.unquote(repo), meta)
        self._json(200, {})

    def preupload(self, kind, repo, rev, params):
        body = json.loads(self._body())
        self._meta(kind, repo, write=True)
        files = [{"path": f["path"], "uploadMode": "lfs" if f.get("size", 0) > 10_000 or f["path"].endswith((".pack", ".safetensors")) else "regular",
                  "shouldIgnore": False} for f in body.get("files", [])]
        self._json(200, {"files": files})

    def lfs_batch(self, prefix, repo, params):
        body = json.loads(self._body())
        kind = {"datasets": "datasets", "spaces": "spaces"}.get(prefix or "", "models")
        self._meta(kind, repo, write=True)
        objects = []
        for obj in body.get("objects", []):
            entry = {"oid": obj["oid"], "size": obj["size"]}
            if not self.server.storage.blob_path(obj["oid"]).exists():
                entry["actions"] = {"upload": {"href": f"{self.server.base_url}/upload/{obj['oid']}"}}
            objects.append(entry)
        self._json(200, {"transfer": "basic", "objects": objects, "hash_algo": "sha256"})

    def upload(self, oid, params):
        data = self._body()
        if self.server.take_failure("upload-429"):  # tests: a rate-limited file upload
            raise HubError(429, "You have exceeded our API request rate limit", retry_after=1)
        if hashlib.sha256(data).hexdigest() != oid:
            raise HubError(400, "sha256 mismatch")
        self.server.storage.put_blob(data)
        self._send(200)

    def commit(self, kind, repo, rev, params):
        lines = [json.loads(line) for line in self._body().splitlines() if line.strip()]
        if self.server.take_failure("commit"):
            raise HubError(403, "injected failure")
        self.server.check_quota(self.server.commit_quota, "You have exceeded our hourly quotas for action: commit")
        storage = self.server.storage
        with storage.lock:
            meta = self._meta(kind, repo, write=True)
            branch = urllib.parse.unquote(rev)
            if branch not in meta["branches"]:
                raise HubError(404, f"Invalid rev id: {branch}", "RevisionNotFound")
            head = meta["branches"][branch]
            header = next((l["value"] for l in lines if l["key"] == "header"), {})
            parent = header.get("parentCommit")
            if parent and parent != head:
                raise HubError(412, "The branch was updated since the parent commit")
            files = dict(meta["commits"][head]["files"])
            for line in lines:
                key, value = line["key"], line["value"]
                if key == "file":
                    files[value["path"]] = storage.put_blob(base64.b64decode(value["content"]))
                elif key == "lfsFile":
                    blob = storage.blob_path(value["oid"])
                    if not blob.exists():
                        raise HubError(400, f"LFS object {value['oid']} was not uploaded")
                    files[value["path"]] = {"sha256": value["oid"], "size": value["size"],
                                            "oid": git_blob_sha1(blob.read_bytes()), "lfs": True}
                    xet = storage.xet.file_by_sha256(value["oid"])  # uploaded through Xet: served through it
                    if xet:
                        files[value["path"]]["xet"] = xet
                elif key == "deletedFile":
                    files.pop(value["path"], None)
                elif key == "deletedFolder":
                    files = {p: f for p, f in files.items() if not p.startswith(value["path"].rstrip("/") + "/")}
            sha = hashlib.sha1(json.dumps([head, sorted(files.items()), time.time_ns()], default=str).encode()).hexdigest()
            meta["commits"][sha] = {"parent": head, "files": files, "title": header.get("summary", ""),
                                    "message": header.get("description", ""),
                                    "date": time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())}
            meta["branches"][branch] = sha
            storage.save(kind, urllib.parse.unquote(repo), meta)
        prefix = TYPES[kind]
        self._json(200, {"commitOid": sha, "commitUrl": f"{self.server.base_url}/{prefix}{urllib.parse.unquote(repo)}/commit/{sha}"})

    def resolve(self, prefix, repo, rev, path, params):
        kind = {"datasets": "datasets", "spaces": "spaces"}.get(prefix or "", "models")
        meta = self._meta(kind, repo)
        sha = resolve_rev(meta, rev)
        path = urllib.parse.unquote(path)
        f = meta["commits"][sha]["files"].get(path)
        if meta.get("gated") and self.headers.get("Authorization") not in [f"Bearer {t}" for t in meta["gated"]]:
            raise HubError(403, f"Access to model {urllib.parse.unquote(repo)} is restricted and you are not in the "
                           "authorized list.", "GatedRepo")
        if f is None:
            raise HubError(404, f"Entry not found: {path}", "EntryNotFound", commit=sha)
        if self.server.take_failure("resolve"):
            raise HubError(403, "injected failure")
        data_path = self.server.storage.blob_path(f["sha256"])
        size = f["size"]
        headers = {"X-Repo-Commit": sha, "ETag": f'"{f["sha256"] if f.get("lfs") else f["oid"]}"',
                   "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
        if f.get("lfs"):
            headers.update({"X-Linked-Etag": f'"{f["sha256"]}"', "X-Linked-Size": size})
        if f.get("xet"):
            token_route = f"{self.server.base_url}/api/{kind}/{urllib.parse.unquote(repo)}/xet-read-token/{sha}"
            self._send(302, b"", {**headers, **self.server.cas.redirect_headers(f["xet"], token_route)})
            return
        start, end, status = 0, size - 1, 200
        rng = None if self.server.ignore_range else self.headers.get("Range")
        if rng:
            m = re.fullmatch(r"bytes=(\d*)-(\d*)", rng.strip())
            if not m or (m.group(1) and int(m.group(1)) >= size):
                self._send(416, b"", {"Content-Range": f"bytes */{size}", **headers})
                return
            if m.group(1):
                start = int(m.group(1))
                end = min(int(m.group(2)), size - 1) if m.group(2) else size - 1
            else:
                start = max(0, size - int(m.group(2)))
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        if self.command == "HEAD":
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, str(v))
            self.send_header("Content-Length", str(end - start + 1 if size else 0))
            self.end_headers()
            return
        with open(data_path, "rb") as fh:
            fh.seek(start)
            body = fh.read(end - start + 1) if size else b""
        self.server.add_served(len(body))
        self._send(status, body, headers)



class HubServer(CountingServer):
    def __init__(self, root, host: str = "127.0.0.1", port: int = 0, token: str | None = None):
        super().__init__((host, port), Handler)
        self.storage = Storage(Path(root))
        self.buckets = BucketStore(Path(root))
        self.token = token
        self.base_url = f"http://{host}:{self.server_address[1]}"
        self.ignore_range = False  # tests: answer Range requests with the whole file (200)
        self.request_quota: Quota | None = None
        self.commit_quota: Quota | None = None
        self.cas_quota: Quota | None = None  # the Xet service's own request limit
        self.cas = CasServer(self, host)
        self.speaks_xet = True  # tests: False answers the Xet token endpoints 404, as an LFS-only server

    def quota_for(self, path: str):
        return self.request_quota, "You have exceeded our API request rate limit: 1000 api requests per 5 minutes"

    def start(self) -> "HubServer":
        threading.Thread(target=self.cas.serve_forever, daemon=True).start()
        threading.Thread(target=self.serve_forever, daemon=True).start()
        return self

    def shutdown(self) -> None:
        self.cas.shutdown()
        super().shutdown()

    def server_close(self) -> None:
        self.cas.server_close()
        super().server_close()


def main(argv=None):
    ap = argparse.ArgumentParser(description="A local Hugging Face Hub-compatible server.")
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--root", required=True, help="where repos and blobs are kept")
    ap.add_argument("--token", default=None, help="require this bearer token")
    args = ap.parse_args(argv)
    server = HubServer(args.root, args.host, args.port, args.token)
    print(f"serving a Hub-compatible API on {server.base_url} (HF_ENDPOINT={server.base_url})", flush=True)
    threading.Thread(target=server.cas.serve_forever, daemon=True).start()
    server.serve_forever()


if __name__ == "__main__":
    main()
