"""What only an object-storage remote has: multipart uploads resumed after a kill, retries of
throttled or failing requests, endpoints that refuse conditional writes, and one-line errors
for the usual misconfigurations. The conformance tests (test_remotes.py, test_view.py,
test_concurrency.py) run on S3 too, through the ``remote_url`` fixture."""

import http.client
import os
import signal
import subprocess
import sys
import textwrap
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from wvc import Repo, clone
from wvc.errors import RemoteError

from .conftest import new_bucket, tree_digests

pytestmark = pytest.mark.usefixtures("s3_env")


class FaultyProxy(ThreadingHTTPServer):
    """An HTTP proxy in front of the S3 server; ``rule(method, path, headers)`` may answer
    a request itself with (status, xml error code) instead of forwarding it."""

    daemon_threads = True

    def __init__(self, upstream: str, rule):
        self.upstream = urllib.parse.urlsplit(upstream)
        self.rule = rule
        self.answered: list[tuple[str, str, int]] = []
        super().__init__(("127.0.0.1", 0), _ProxyHandler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def handle_error(self, request, client_address):
        pass  # a client that hung up (botocore closing a pooled connection) is no failure here


class _ProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _handle(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        verdict = self.server.rule(self.command, self.path, self.headers)
        if verdict is not None:
            status, code = verdict
            self.server.answered.append((self.command, self.path, status))
            xml = f"<Error><Code>{code}</Code><Message>{code}</Message></Error>".encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(xml)))
            self.end_headers()
            self.wfile.write(xml)
            return
        up = http.client.HTTPConnection(self.server.upstream.hostname, self.server.upstream.port, timeout=60)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection", "keep-alive")}
        up.request(self.command, self.path, body=body, headers=headers)
        resp = up.getresponse()
        data = resp.read()
        self.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in ("connection", "keep-alive", "transfer-encoding", "content-length", "server", "date"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        up.close()

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle


def model_repo(tmp_path, name="a", mb=1, seed=0) -> Repo:
    repo = Repo.init(tmp_path / name)
    g = torch.Generator().manual_seed(seed)
    save_file({"w": torch.randn(mb << 18, generator=g)}, str(repo.root / "model.safetensors"))  # fp32: incompressible
    repo.commit("v1")
    return repo


def test_throttling_and_server_errors_are_retried_with_back_off(tmp_path, s3_server, monkeypatch):
    failures = {"n": 0}

    def twice_503(method, path, headers):
        if method == "PUT" and "/refs/" in path and failures["n"] < 2:
            failures["n"] += 1
            return 503, "SlowDown"
        return None

    proxy = FaultyProxy(s3_server, twice_503)
    bucket = new_bucket()
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    repo = model_repo(tmp_path)
    repo.remote_add("origin", f"s3://{bucket}/m")
    repo.push()
    assert [a[2] for a in proxy.answered] == [503, 503]  # answered twice, then the ref went through
    copy = clone(f"s3://{bucket}/m", tmp_path / "copy")
    assert tree_digests(copy.root) == tree_digests(repo.root)


def test_an_endpoint_without_conditional_writes_is_refused_and_nothing_moves(tmp_path, s3_server, monkeypatch):
    def no_conditionals(method, path, headers):
        if method == "PUT" and ("If-Match" in headers or "If-None-Match" in headers):
            return 501, "NotImplemented"
        return None

    bucket = new_bucket()
    proxy = FaultyProxy(s3_server, no_conditionals)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    repo = model_repo(tmp_path)
    repo.remote_add("origin", f"s3://{bucket}/m")
    with pytest.raises(RemoteError, match="refuses conditional writes"):
        repo.push()
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server)
    import boto3

    keys = [o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket=bucket).get("Contents", [])]
    assert not [k for k in keys if "/refs/" in k]  # no branch was written without a compare-and-swap


@pytest.mark.parametrize("case", ["no bucket", "access denied", "wrong region", "unreachable"])
def test_misconfigurations_are_one_line_errors_without_credentials(tmp_path, s3_server, monkeypatch, case):
    bucket = new_bucket()
    url = f"s3://{bucket}/m"
    if case == "no bucket":
        url = "s3://no-such-bucket-here/m"
    elif case in ("access denied", "wrong region"):
        # (a wrong region: what S3 and MinIO answer a request signed for another region)
        status, code = (403, "AccessDenied") if case == "access denied" else (400, "AuthorizationHeaderMalformed")
        proxy = FaultyProxy(s3_server, lambda *a: (status, code))
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    else:
        monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
        monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")
    r = subprocess.run([sys.executable, "-m", "wvc", "clone", url, str(tmp_path / "out")], capture_output=True,
                       text=True, timeout=120)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 1 and len(lines) == 1 and lines[0].startswith("wvc: error:"), r.stderr
    expected = {"no bucket": "bucket does not exist", "access denied": "access denied",
                "wrong region": "another region", "unreachable": "cannot reach the S3 endpoint"}[case]
    assert expected in lines[0]
    assert os.environ["AWS_SECRET_ACCESS_KEY"] not in r.stderr + r.stdout
    assert not (tmp_path / "out").exists()


KILLER = textwrap.dedent("""
    import os, signal, sys
    import wvc.remotes.s3 as s3
    s3.MULTIPART_THRESHOLD, s3.PART_BYTES, s3.PART_WORKERS = 6 << 20, 5 << 20, 1
    real = s3.S3Backend._multipart
    def killed_after_two_parts(self, path, source, size):
        upload_part = self.client.upload_part
        sent = []
        def counting(**kwargs):
            if len(sent) == 2:
                os.kill(os.getpid(), signal.SIGKILL)
            sent.append(kwargs["PartNumber"])
            return upload_part(**kwargs)
        self.client.upload_part = counting
        return real(self, path, source, size)
    s3.S3Backend._multipart = killed_after_two_parts
    from wvc.api import Repo
    Repo.open(sys.argv[1]).push()
""")


def test_a_multipart_upload_killed_midway_is_resumed_by_the_next_push(tmp_path, monkeypatch):
    import wvc.remotes.s3 as s3

    bucket = new_bucket()
    repo = model_repo(tmp_path, mb=20)  # a ~21 MB pack: 5 parts of 5 MiB
    repo.remote_add("origin", f"s3://{bucket}/m")
    r = subprocess.run([sys.executable, "-c", KILLER, str(repo.root)], capture_output=True, text=True, timeout=300)
    assert r.returncode == -signal.SIGKILL, r.stderr
    import boto3

    client = boto3.client("s3")
    uploads = client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    assert len(uploads) == 1  # the interrupted upload, with its first parts
    with pytest.raises(RemoteError, match="not a wvc remote|no branches"):
        clone(f"s3://{bucket}/m", tmp_path / "early")  # nothing was published: no ref moved

    monkeypatch.setattr(s3, "MULTIPART_THRESHOLD", 6 << 20)
    monkeypatch.setattr(s3, "PART_BYTES", 5 << 20)
    pack = next(p for p in (repo.root / ".wvc" / "packs").glob("pack-*.pack"))
    result = repo.push()
    assert result.uploaded_bytes < pack.stat().st_size - (9 << 20)  # the two parts sent before the kill are kept
    assert client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    copy = clone(f"s3://{bucket}/m", tmp_path / "copy")
    assert tree_digests(copy.root) == tree_digests(repo.root)


def test_a_lazy_clone_downloads_about_one_versions_payloads(tmp_path):
    bucket = new_bucket()
    repo = Repo.init(tmp_path / "a", max_chain=1)  # each version a delta against the keyframe
    g = torch.Generator().manual_seed(0)
    w = torch.randn(1 << 18, generator=g)
    stored = []
    for step in range(3):
        w += torch.randn(w.shape, generator=g) * 1e-3
        save_file({"w": w.to(torch.bfloat16)}, str(repo.root / "model.safetensors"))
        stored.append(repo.commit(f"step {step}").stored_bytes)
    repo.remote_add("origin", f"s3://{bucket}/m")
    pushed = repo.push()
    assert pushed.uploaded_bytes < sum(stored) + (64 << 10)  # about the stored bytes, plus commits and trees
    lazy_dir = tmp_path / "lazy"
    r = subprocess.run([sys.executable, "-m", "wvc", "clone", "--lazy", "--json", f"s3://{bucket}/m", str(lazy_dir)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    import json

    downloaded = json.loads(r.stdout)["downloaded_bytes"]
    head_version = stored[0] + stored[2]  # the keyframes and the tip's deltas against them
    assert downloaded < head_version + (64 << 10) and downloaded < sum(stored)
    assert (lazy_dir / "model.safetensors").read_bytes() == (repo.root / "model.safetensors").read_bytes()


def test_s3_urls_are_checked(tmp_path):
    repo = Repo.init(tmp_path / "a")
    for bad in ("s3://", "s3://A_B/x", "s3://ok-bucket/../x", "s3://ok-bucket/a/./b"):
        with pytest.raises(RemoteError, match="invalid S3 URL"):
            repo.remote_add("x", bad)
    repo.remote_add("fine", "s3://ok-bucket/some/prefix/")
    assert repo.remotes()["fine"] == "s3://ok-bucket/some/prefix/"


def test_the_secret_never_reaches_the_repository(tmp_path):
    bucket = new_bucket()
    repo = model_repo(tmp_path)
    repo.remote_add("origin", f"s3://{bucket}/m")
    repo.push()
    secret = os.environ["AWS_SECRET_ACCESS_KEY"].encode()
    for path in Path(repo.root / ".wvc").rglob("*"):
        if path.is_file():
            assert secret not in path.read_bytes(), path
