import hashlib
import itertools
import json
import os
import sqlite3
import struct
from pathlib import Path

# The local Hub server speaks LFS, not Xet. huggingface_hub reads this once, at import, and
# wvc no longer sets it for the process (a library must not), so the suite sets it first.
os.environ["HF_HUB_DISABLE_XET"] = "1"

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
    return hub


_remote_names = itertools.count()


@pytest.fixture(params=["path", "hub"])
def remote_url(request, tmp_path):
    """Each remote test runs against a directory remote and a Hub remote."""
    n = next(_remote_names)
    return str(tmp_path / f"remote-{n}") if request.param == "path" else f"hf://team/model-{n}"


@pytest.fixture
def cli(monkeypatch):
    """Run the CLI in-process in a given directory; returns the click Result."""

    def run(cwd, *args):
        monkeypatch.chdir(cwd)
        return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)

    return run


__all__ = ["TOKEN", "ALL_DTYPES", "random_tensor", "sha256", "tree_digests", "repo_state", "write_raw_safetensors", "save_file"]
