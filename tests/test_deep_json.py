"""JSON nested far deeper than Python's parser's stack, from a remote, is malformed input:
one error line, never `internal error: RecursionError` (issue 37, finding 23)."""

import struct

import pytest
import zstandard

import wvc
from wvc import Repo
from wvc.errors import WvcError
from wvc.remotes.catalog import MAGIC, catalog_name

from .test_everyday import run, two_tensors

DEEP = b"[" * 200_000 + b"]" * 200_000


def _remote(tmp_path):
    repo = Repo.init(tmp_path / "src")
    two_tensors(repo.root / "model.safetensors")
    repo.commit("one")
    remote = tmp_path / "remote"
    repo.remote_add("origin", str(remote))
    repo.push()
    return repo, remote


def _catalog(meta: bytes) -> bytes:
    return zstandard.ZstdCompressor().compress(MAGIC + struct.pack("<I", len(meta)) + meta)


def _plant(remote, kind):
    if kind == "catalog header":
        data = _catalog(DEEP)
    elif kind == "catalog entries":
        data = _catalog(b'{"pack": null, "entries": ' + DEEP + b', "objects": []}')
    if kind.startswith("catalog"):
        (remote / "catalogs" / f"{catalog_name(data)}.cat").write_bytes(data)
    elif kind == "retired record":
        (remote / "retired").mkdir(exist_ok=True)
        (remote / "retired" / "0000000001-0123456789abcdef.json").write_bytes(b'{"paths": ' + DEEP + b"}")
    elif kind == "format-1 idx":
        (remote / "packs" / ("pack-" + "ab" * 32 + ".idx")).write_bytes(DEEP)
    elif kind == "base record":
        (remote / "base.json").write_bytes(DEEP)


@pytest.mark.parametrize("kind", ["catalog header", "catalog entries", "retired record", "format-1 idx", "base record"])
def test_deeply_nested_json_from_a_remote_is_one_error_line(tmp_path, kind):
    repo, remote = _remote(tmp_path)
    _plant(remote, kind)
    for args in (("clone", remote, "c1"), ("clone", "--lazy", remote, "c2")):
        r = run(tmp_path, *args, check=False)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 1 and len(lines) == 1 and lines[0].startswith("wvc: error:"), r.stderr[-2000:]
        assert "RecursionError" not in r.stderr and "internal error" not in r.stderr
    r = run(repo.root, "fetch", check=False)
    assert r.returncode == 1 and "internal error" not in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
    with pytest.raises(WvcError):
        wvc.open(str(remote), "main")
