"""Storage Buckets on the local Hub server: mutable, unversioned, Xet-backed object storage.

The API huggingface_hub 2.4 speaks (hub-docs ``docs/hub/buckets.md``; ``HfApi.create_bucket``,
``bucket_info``, ``list_bucket_tree``, ``get_bucket_paths_info``, ``batch_bucket_files``,
``get_bucket_file_metadata``, downloads through ``/buckets/{id}/resolve/{path}``). Files are
added by Xet hash after their upload to the CAS; a batch is applied operation by operation,
not as a transaction, and an add over an existing path replaces it, as on the Hub. There is
no compare-and-swap.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
from pathlib import Path

from .http_base import HubError, tree_listing

BUCKET = r"/api/buckets/([^/]+)/([^/]+)"


def _now(t: float | None = None) -> str:
    t = time.time() if t is None else t
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d}Z"


class BucketStore:
    """Each bucket's files: a header file (``private``, ``createdAt``) and a log of its file
    operations, one line each, kept in memory once read. An operation appends a line, so it
    costs the same however many files the bucket holds: rewriting the whole bucket for each
    (as this store did) made a long run's pushes slow down with the files the grace hour keeps,
    which the real service does not do."""

    def __init__(self, root: Path):
        self.root = Path(root) / "buckets"
        self.root.mkdir(parents=True, exist_ok=True)
        self.lock = threading.RLock()
        self._cache: dict[str, dict] = {}

    def _path(self, bucket: str) -> Path:
        return self.root / (bucket.replace("/", "--") + ".json")

    def _meta(self, bucket: str) -> dict:
        """The bucket as it stands (the store's own copy: callers get copies); under the lock."""
        meta = self._cache.get(bucket)
        if meta is None:
            path = self._path(bucket)
            if not path.is_file():
                raise HubError(404, f"Bucket {bucket} not found", "RepoNotFound")
            meta = {**json.loads(path.read_text()), "files": {}}
            log = path.with_suffix(".log")
            for line in log.read_text().splitlines() if log.is_file() else ():
                name, record = json.loads(line)
                if record is None:
                    meta["files"].pop(name, None)
                else:
                    meta["files"][name] = record
            self._cache[bucket] = meta
        return meta

    def load(self, bucket: str, files: bool = True) -> dict:
        """The bucket's header, and (``files``) a copy of its files: read while others write."""
        with self.lock:
            meta = self._meta(bucket)
            return {**meta, "files": dict(meta["files"]) if files else None}

    def put(self, bucket: str, path: str, record: dict | None) -> None:
        """Add (or replace) a file's record, or delete it (None)."""
        with self.lock:
            files = self._meta(bucket)["files"]
            if record is None:
                files.pop(path, None)
            else:
                files[path] = record
            with open(self._path(bucket).with_suffix(".log"), "a") as fh:
                fh.write(json.dumps([path, record]) + "\n")

    def create(self, bucket: str, private: bool) -> bool:
        with self.lock:
            path = self._path(bucket)
            if path.is_file():
                return False
            path.with_suffix(".log").unlink(missing_ok=True)
            tmp = path.with_suffix(f".{threading.get_ident()}.tmp")
            tmp.write_text(json.dumps({"private": private, "createdAt": _now()}))
            tmp.replace(path)
            return True


class BucketRoutes:
    """The bucket endpoints, mixed into the Hub handler (which brings _json, _body, _auth...)."""

    def bucket_routes(self):
        return [
            ("POST", rf"{BUCKET}", self.bucket_create),
            ("GET", rf"{BUCKET}", self.bucket_info),
            ("GET", rf"{BUCKET}/tree(?:/(.*))?", self.bucket_tree),
            ("POST", rf"{BUCKET}/paths-info", self.bucket_paths_info),
            ("POST", rf"{BUCKET}/batch", self.bucket_batch),
            ("GET", rf"{BUCKET}/xet-(read|write)-token(?:/[^/]*)?", self.bucket_xet_token),
            ("GET", r"/buckets/([^/]+)/([^/]+)/resolve/(.+)", self.bucket_resolve),
            ("HEAD", r"/buckets/([^/]+)/([^/]+)/resolve/(.+)", self.bucket_resolve),
        ]

    def _bucket(self, ns, name, write=False, files=True) -> tuple[str, dict]:
        bucket = f"{urllib.parse.unquote(ns)}/{urllib.parse.unquote(name)}"
        meta = self.server.buckets.load(bucket, files)
        self._auth(meta, write)
        return bucket, meta

    def bucket_create(self, ns, name, params):
        body = json.loads(self._body() or b"{}")
        self._auth(None, write=True)
        bucket = f"{'user' if ns == 'me' else urllib.parse.unquote(ns)}/{urllib.parse.unquote(name)}"
        private = body.get("private", body.get("visibility", "private") == "private")
        created = self.server.buckets.create(bucket, bool(private))
        url = {"url": f"{self.server.base_url}/buckets/{bucket}"}
        self._json(200 if created else 409, url if created else {**url, "error": "You already created this bucket"})

    def bucket_info(self, ns, name, params):
        bucket, meta = self._bucket(ns, name)
        self._json(200, {"id": bucket, "private": meta["private"], "createdAt": meta["createdAt"],
                         "size": sum(f["size"] for f in meta["files"].values()), "totalFiles": len(meta["files"])})

    @staticmethod
    def _bucket_entry(path: str, f: dict) -> dict:
        return {"type": "file", "path": path, "size": f["size"], "xetHash": f["xetHash"], "mtime": f.get("mtime"),
                "uploadedAt": f["uploadedAt"]}

    def bucket_tree(self, ns, name, prefix, params):
        _, meta = self._bucket(ns, name)
        prefix = urllib.parse.unquote(prefix or "").strip("/")
        recursive = params.get("recursive", ["false"])[0].lower() == "true"
        paths, dirs = tree_listing(meta["files"], prefix, recursive)
        out = [self._bucket_entry(p, meta["files"][p]) for p in paths]
        out += [{"type": "directory", "path": d, "uploadedAt": None} for d in dirs]
        self._json(200, out)

    def bucket_paths_info(self, ns, name, params):
        body = self._body()
        _, meta = self._bucket(ns, name)
        try:
            paths = json.loads(body).get("paths", [])
        except ValueError:
            paths = urllib.parse.parse_qs(body.decode()).get("paths", [])
        self._json(200, [self._bucket_entry(p, meta["files"][p]) for p in paths if p in meta["files"]])

    def bucket_batch(self, ns, name, params):
        lines = [json.loads(line) for line in self._body().splitlines() if line.strip()]
        if self.server.take_failure("commit"):
            raise HubError(403, "injected failure")
        fault = self.server.take_bucket_fault({str(op.get("type")) for op in lines})
        if fault is not None:
            if fault.get("delay"):  # the request reaches the bucket late (a queue, a slow link)
                time.sleep(fault["delay"])
            if fault.get("status"):  # refused, nothing applied (a rate limit, an overloaded server)
                raise HubError(fault["status"], "You have exceeded our API request rate limit"
                               if fault["status"] == 429 else "injected failure", retry_after=fault.get("retry_after"))
        self.server.check_quota(self.server.commit_quota, "You have exceeded our hourly quotas for action: commit")
        store, failed = self.server.buckets, []
        bucket, _ = self._bucket(ns, name, write=True, files=False)
        for op in lines:  # one at a time, each saved: a batch is not a transaction
            with store.lock:
                path = op.get("path", "")
                if not isinstance(path, str) or not path or path.startswith("/") or ".." in path.split("/"):
                    failed.append({"path": path, "error": "invalid path"})
                    continue
                if op.get("type") in ("addFile", "copyFile"):
                    record = self.server.storage.xet.file_record(str(op.get("xetHash", "")))
                    if record is None:
                        failed.append({"path": path, "error": f"unknown xet hash {op.get('xetHash')!r}"})
                        continue
                    store.put(bucket, path, {
                        "xetHash": op["xetHash"], "size": record["size"], "uploadedAt": _now(),
                        "mtime": _now(op["mtime"] / 1000) if isinstance(op.get("mtime"), (int, float)) else None})
                elif op.get("type") == "deleteFile":
                    store.put(bucket, path, None)
                else:
                    failed.append({"path": path, "error": f"unknown operation {op.get('type')!r}"})
                    continue
                self.server.bucket_ops.append((op["type"], f"{bucket}/{path}"))
        self._json(200 if len(failed) < len(lines) or not lines else 422, {"failed": failed})

    def bucket_xet_token(self, ns, name, scope, params):
        self._bucket(ns, name, write=scope == "write", files=False)
        self._json(200, *self.server.cas.token_answer(scope, sha256_required=False))  # bucket files need no sha256

    def bucket_resolve(self, ns, name, path, params):
        bucket, meta = self._bucket(ns, name)
        path = urllib.parse.unquote(path)
        f = meta["files"].get(path)
        if f is None:
            raise HubError(404, f"Entry not found: {path}", "EntryNotFound")
        if self.server.take_failure("resolve"):
            raise HubError(403, "injected failure")
        token_route = f"{self.server.base_url}/api/buckets/{bucket}/xet-read-token"
        self._send(302, b"", {**self.server.cas.redirect_headers(f["xetHash"], token_route), "X-Linked-Size": f["size"],
                              "ETag": f'"{f["xetHash"]}"', "Content-Type": "application/octet-stream"})
