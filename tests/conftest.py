import hashlib
import itertools
import json
import os
import sqlite3
import struct
from pathlib import Path

# The suite runs as users run: hf_xet installed and Xet enabled (the local Hub server speaks
# it); the remote conformance tests also run on the LFS path (the "hub-lfs" remote below).
os.environ.pop("HF_HUB_DISABLE_XET", None)
# The suite's quotas are the Hub's in miniature (windows of seconds, not minutes): hf_xet's own
# retries of a 429 or 5xx are scaled to match (its defaults wait about 30 s before giving up,
# and then wvc's back-off takes over; tests/test_transient_faults.py checks that hand-over).
os.environ.setdefault("HF_XET_CLIENT_RETRY_BASE_DELAY", "100ms")
os.environ.setdefault("HF_XET_CLIENT_RETRY_MAX_DURATION", "5s")

import huggingface_hub  # noqa: E402,F401 - before any in-process CLI run: the CLI would otherwise set
# HF_HUB_DISABLE_PROGRESS_BARS, which huggingface_hub reads once at import, for the whole session
import pytest  # noqa: E402
import torch  # noqa: E402
from click.testing import CliRunner  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from wvc import Repo  # noqa: E402
from wvc.cli import main  # noqa: E402

# Child processes (the CLI run as a user runs it, crash drivers, import probes) must import
# the wvc under test, not whichever checkout an editable install points at.
REPO_ROOT = Path(__file__).resolve().parent.parent
os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])

ALL_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2, "I64": torch.int64,
    "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool,
}


def random_tensor(dtype, shape, seed):
    """A tensor of random *bit patterns* (NaNs, infs, subnormals included) of ``dtype``."""
    g = torch.Generator().manual_seed(seed)
    n = 1
    for d in shape:
        n *= d
    width = torch.empty(0, dtype=dtype).element_size()
    raw = torch.randint(0, 256, (n * width,), dtype=torch.uint8, generator=g)
    if dtype == torch.bool:
        raw = raw % 2
    return raw.view(dtype).reshape(shape)


def sha256(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def tree_digests(root) -> dict[str, str]:
    """sha256 of every file under root, .wvc excluded."""
    root = Path(root)
    return {
        p.relative_to(root).as_posix(): sha256(p)
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".wvc" not in p.relative_to(root).parts
    }


def repo_state(root) -> str:
    """A fingerprint of everything a failed operation must leave unchanged."""
    root = Path(root)
    conn = sqlite3.connect(root / ".wvc" / "wvc.db")
    h = hashlib.sha256()
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")]
    for t in tables:
        if t == "stat_cache":
            continue
        for row in conn.execute(f"SELECT * FROM {t} ORDER BY 1"):
            h.update(repr(row).encode())
    conn.close()
    packs = sorted(p.name for p in (root / ".wvc" / "packs").iterdir() if p.name.startswith("pack-"))
    h.update(json.dumps(packs).encode())
    h.update(json.dumps(tree_digests(root)).encode())
    return h.hexdigest()


def write_raw_safetensors(path, header: dict | bytes, data: bytes = b"", header_len: int | None = None):
    hb = header if isinstance(header, bytes) else json.dumps(header).encode()
    n = len(hb) if header_len is None else header_len
    Path(path).write_bytes(struct.pack("<Q", n) + hb + data)


@pytest.fixture
def repo(tmp_path):
    r = Repo.init(tmp_path / "model")
    yield r
    r.close()


TOKEN = "test-token"


@pytest.fixture(scope="session")
def hub(tmp_path_factory):
    """The local Hub-compatible server (wvc.testing.hub), one for the session, token required."""
    from wvc.testing.hub import HubServer

    server = HubServer(tmp_path_factory.mktemp("hub"), token=TOKEN).start()
    yield server
    server.shutdown()


@pytest.fixture
def hub_env(hub, monkeypatch, tmp_path):
    """The real huggingface_hub client pointed at ``hub``, with a cache of this test's own."""
    monkeypatch.setenv("HF_ENDPOINT", hub.base_url)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("HF_XET_CACHE", str(tmp_path / "xet-cache"))
    return hub


def use_lfs_path(monkeypatch) -> None:
    """huggingface_hub as with ``HF_HUB_DISABLE_XET=1`` (or without hf_xet): LFS uploads, plain
    downloads. It reads the variable once, at import; child processes read the environment."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")


@pytest.fixture(scope="session")
def s3_server():
    """A real S3-protocol server process (moto's server mode) on 127.0.0.1: its endpoint URL."""
    import socket
    import subprocess
    import sys
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, str(Path(__file__).parent / "s3_server.py"), str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while True:  # ready when it accepts a connection
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the moto S3 server did not start") from None
            time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    proc.terminate()
    proc.wait(timeout=30)


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    """The standard AWS environment pointed at the local S3 server (what a MinIO user sets)."""
    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "wvc-test-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wvc-test-secret")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    return s3_server


_remote_names = itertools.count()


def new_bucket() -> str:
    import boto3

    name = f"wvc-test-{next(_remote_names)}"
    boto3.client("s3").create_bucket(Bucket=name)
    return name


@pytest.fixture(params=["path", "hub", "hub-lfs", "bucket", "s3"])
def remote_url(request, tmp_path):
    """Each remote test runs against a directory remote, a Hub remote (through Xet, as
    huggingface_hub does whenever hf_xet is installed; and once more on the LFS path) and an S3
    bucket."""
    if request.param == "s3":
        request.getfixturevalue("s3_env")
        return f"s3://{new_bucket()}/team/model"
    if request.param == "hub-lfs":
        use_lfs_path(request.getfixturevalue("monkeypatch"))
    n = next(_remote_names)
    if request.param == "bucket":
        return f"hf://buckets/team/runs-{n}/model"
    return str(tmp_path / f"remote-{n}") if request.param == "path" else f"hf://team/model-{n}"


def url_of(kind: str, tmp_path, request, name: str) -> str:
    """A fresh remote of ``kind`` ("path", "hub" or "s3") for one test."""
    if kind == "s3":
        request.getfixturevalue("s3_env")
        return f"s3://{new_bucket()}/{name}"
    return str(tmp_path / "remote") if kind == "path" else f"hf://team/{name}-{tmp_path.name}"


def push_until_landed(repo, attempts: int = 1000) -> bool:
    """Push, rebasing onto what other pushers landed meanwhile; False if it never lands."""
    import time

    from wvc.errors import NonFastForward, RemoteChanged

    for _ in range(attempts):
        try:
            repo.push()
            return True
        except NonFastForward:
            repo.pull(rebase=True)
        except RemoteChanged:
            time.sleep(0.01)  # another pusher holds the ref lock; back off briefly
    return False


class RemoteFiles:
    """The files of a remote as stored, whatever holds them, for tests that tamper with them."""

    def __init__(self, url: str, hub):
        self.url, self.hub = url, hub

    def _forged_entry(self, ref: str, commit: str) -> bytes:
        """The newest confirmed log entry's refs with ``ref`` set to ``commit``."""
        log = sorted(p[:-3] for p in self.paths() if p.startswith("reflog/") and p.endswith(".ok"))
        refs = json.loads(self.read(log[-1] + ".json"))["refs"] if log else {}
        refs[ref] = commit
        return json.dumps({"format": 1, "seq": 999999999999, "prev": log[-1][7:] if log else None,
                           "refs": refs}).encode()

    def _bucket(self) -> tuple[str, str]:
        ns, name, *rest = self.url[len("hf://buckets/"):].split("/")
        return f"{ns}/{name}", "/".join(rest) + "/" if rest else ""

    def paths(self) -> list[str]:
        if self.url.startswith("hf://buckets/"):
            bucket, prefix = self._bucket()
            files = self.hub.buckets.load(bucket)["files"]
            return sorted(p[len(prefix):] for p in files if p.startswith(prefix))
        if self.url.startswith("hf://"):
            meta = self.hub.storage.load("models", self.url[len("hf://"):])
            return sorted(meta["commits"][meta["branches"]["main"]]["files"])
        if self.url.startswith("s3://"):
            bucket, prefix = self._s3()
            import boto3

            pages = boto3.client("s3").get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
            return sorted(o["Key"][len(prefix):] for page in pages for o in page.get("Contents", ()))
        root = Path(self.url)
        return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())

    def read(self, path: str) -> bytes:
        if self.url.startswith("hf://buckets/"):
            bucket, prefix = self._bucket()
            xet = self.hub.buckets.load(bucket)["files"][prefix + path]["xetHash"]
            return self.hub.storage.blob_path(self.hub.storage.xet.file_record(xet)["sha256"]).read_bytes()
        if self.url.startswith("hf://"):
            meta = self.hub.storage.load("models", self.url[len("hf://"):])
            sha = meta["commits"][meta["branches"]["main"]]["files"][path]["sha256"]
            return self.hub.storage.blob_path(sha).read_bytes()
        if self.url.startswith("s3://"):
            import boto3

            bucket, prefix = self._s3()
            return boto3.client("s3").get_object(Bucket=bucket, Key=prefix + path)["Body"].read()
        return (Path(self.url) / path).read_bytes()

    def write(self, path: str, data: bytes) -> None:
        """Write or replace a file (on the Hub, as a commit that anyone with write access could make)."""
        if self.url.startswith("hf://buckets/"):
            from huggingface_hub import HfApi

            bucket, prefix = self._bucket()
            if path.startswith("refs/"):  # a bucket's refs live in its log: forge a confirmed entry
                data = self._forged_entry(path, data.decode().strip())
                path = "reflog/999999999999-ffffffffffffffff.json"  # past any real entry
                HfApi(endpoint=self.hub.base_url, token=TOKEN).batch_bucket_files(
                    bucket, add=[(data, prefix + path), (data, prefix + path[:-5] + ".ok")])
                return
            HfApi(endpoint=self.hub.base_url, token=TOKEN).batch_bucket_files(bucket, add=[(data, prefix + path)])
        elif self.url.startswith("hf://"):
            from huggingface_hub import CommitOperationAdd, HfApi

            HfApi(endpoint=self.hub.base_url, token=TOKEN).create_commit(
                self.url[len("hf://"):], [CommitOperationAdd(path, data)], commit_message="tamper")
        elif self.url.startswith("s3://"):
            import boto3

            bucket, prefix = self._s3()
            boto3.client("s3").put_object(Bucket=bucket, Key=prefix + path, Body=data)
        else:
            p = Path(self.url) / path
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)

    def _s3(self) -> tuple[str, str]:
        bucket, _, prefix = self.url[len("s3://"):].partition("/")
        return bucket, (prefix.strip("/") + "/") if prefix.strip("/") else ""


@pytest.fixture
def cli(monkeypatch):
    """Run the CLI in-process in a given directory; returns the click Result."""

    def run(cwd, *args):
        monkeypatch.chdir(cwd)
        return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)

    return run


__all__ = ["RemoteFiles", "TOKEN", "ALL_DTYPES", "random_tensor", "sha256", "tree_digests", "repo_state", "write_raw_safetensors", "save_file"]
