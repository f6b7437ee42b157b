"""Hostile remotes (architecture issue): each gets one clear error line, writes nothing
outside ``.wvc/`` (a failed clone leaves nothing at all), and costs bounded memory.

Remotes are crafted file by file in the documented layout (remotes/interface.py), with real
commit and tree objects whose ids check out, so only the part under test is hostile."""

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

import wvc
from wvc import codec, ids
from wvc.codec.container import Method
from wvc.formats.dtypes import BYTES
from wvc.model.versions import Commit, FileEntry, Tree, canonical_json
from wvc.remotes.layout import commit_path, pack_path, tree_path
from wvc.store.chains import MAX_CHAIN_LINKS
from wvc.store.packs import END, MAGIC, PackEntry

from benchmarks.clone_memory import PROBE  # runs the CLI and reports its VmHWM

def run_wvc(cwd: Path, *args) -> tuple[subprocess.CompletedProcess, int]:
    """``wvc ARGS`` in its own process: (result, peak RSS in MB)."""
    hwm = cwd / ".hwm"
    r = subprocess.run([sys.executable, "-c", PROBE, *map(str, args)], cwd=cwd, capture_output=True, text=True,
                       env={**os.environ, "WVC_HWM_FILE": str(hwm)})
    peak = int(hwm.read_text()) // 1024
    hwm.unlink()
    return r, peak


def one_line_error(r: subprocess.CompletedProcess) -> str:
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode != 0 and len(lines) == 1 and lines[0].startswith("wvc: error:"), r.stderr
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
    return lines[0]


def pack_bytes(entries: list[tuple[str, bytes, int, int, str | None]],
               declared: dict[str, dict] | None = None) -> tuple[str, bytes, list[PackEntry]]:
    """A well-formed pack of (id, payload, raw_size, method, base); ``declared`` overrides
    fields of its embedded index (only there: its .idx copy stays honest)."""
    body, index, offset = bytearray(MAGIC), [], len(MAGIC)
    for oid, payload, raw_size, method, base in entries:
        index.append(PackEntry(oid, offset, len(payload), raw_size, method, base))
        body += payload
        offset += len(payload)
    embedded = [{**e.to_json(), **(declared or {}).get(e.id, {})} for e in index]
    index_bytes = canonical_json(embedded)
    index_offset = len(body)
    body += index_bytes
    h = ids.hasher(ids.PACK)
    h.update(bytes(body))
    checksum = h.digest()
    body += struct.pack("<QQ32s8s", index_offset, len(index_bytes), checksum, END)
    return checksum.hex(), bytes(body), index


def write_remote(root: Path, chunk_ids: list[str], packs: list[tuple[str, bytes, list[PackEntry]]], size: int,
                 extra: dict[str, bytes] | None = None) -> str:
    """A directory remote whose main branch holds one commit of one blob made of ``chunk_ids``."""
    files = {"wvc.json": json.dumps({"format": 1}).encode()}
    tree = Tree((FileEntry.of("weights.bin", "blob", size, chunks=tuple(chunk_ids)),), 4 << 20)
    commit = Commit(tree.id, (), "mallory", 0, "hostile", {})
    files[tree_path(tree.id)] = tree.to_bytes()
    files[commit_path(commit.id)] = commit.to_bytes()
    files["refs/heads/main"] = (commit.id + "\n").encode()
    for name, data, index in packs:
        files[pack_path(name)] = data
        files[pack_path(name, "idx")] = canonical_json([e.to_json() for e in index])
    files.update(extra or {})
    for path, data in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)
    return commit.id


def keyframe(raw: bytes) -> tuple[str, bytes, int, int, None]:
    enc = codec.encode(raw, BYTES)
    return ids.chunk_id(raw), enc.payload, len(raw), int(enc.method), None


def delta(raw: bytes, base_raw: bytes) -> tuple[str, bytes, int, int, str]:
    enc = codec.encode(raw, BYTES, base_raw, method=Method.XOR)
    assert enc.uses_base
    return ids.chunk_id(raw), enc.payload, len(raw), int(enc.method), ids.chunk_id(base_raw)


def assert_clone_refused(tmp_path: Path, remote: Path, *flags, expect: str, max_rss_mb: int = 200):
    r, peak = run_wvc(tmp_path, "clone", *flags, remote, tmp_path / "dest")
    line = one_line_error(r)
    assert expect in line, line
    assert not (tmp_path / "dest").exists()  # nothing left behind, inside or outside .wvc
    assert peak < max_rss_mb, f"clone peaked at {peak} MB"
    return line


def test_a_pack_whose_own_index_declares_a_multi_gib_chunk_is_refused_before_allocating(tmp_path):
    raw = os.urandom(4096)
    oid = ids.chunk_id(raw)
    name, data, index = pack_bytes([keyframe(raw)], declared={oid: {"raw_size": 3 << 30}})
    remote = tmp_path / "remote"
    write_remote(remote, [oid], [(name, data, index)], len(raw))
    assert_clone_refused(tmp_path, remote, expect="out of bounds")


def test_a_two_object_delta_cycle_is_refused(tmp_path):
    a, b = os.urandom(256), os.urandom(256)
    da, db = delta(a, b), delta(b, a)  # a against b, b against a: neither can ever be decoded
    name, data, index = pack_bytes([da, db])
    remote = tmp_path / "remote"
    write_remote(remote, [da[0]], [(name, data, index)], 256)
    assert_clone_refused(tmp_path, remote, expect="cyclic")
    assert_clone_refused(tmp_path, remote, "--lazy", expect="cyclic")
    with pytest.raises(wvc.WvcError, match="cyclic"):
        wvc.open(str(remote)).read_file("weights.bin")


@pytest.fixture(scope="module")
def deep_remote(tmp_path_factory) -> Path:
    """A chain of 1,100 deltas, one version each step from a keyframe (deeper than wvc reads)."""
    tail = os.urandom(60)
    raws = [struct.pack("<I", i) + tail for i in range(1100)]  # each a few bytes off the one before
    objects = [keyframe(raws[0])] + [delta(raws[i], raws[i - 1]) for i in range(1, len(raws))]
    name, data, index = pack_bytes(objects)
    remote = tmp_path_factory.mktemp("deep") / "remote"
    write_remote(remote, [objects[-1][0]], [(name, data, index)], 64)
    return remote


@pytest.mark.parametrize("flags", [(), ("--lazy",)], ids=["clone", "lazy-clone"])
def test_a_chain_deeper_than_the_bound_is_refused_without_recursion(tmp_path, deep_remote, flags):
    assert 1100 > MAX_CHAIN_LINKS
    assert_clone_refused(tmp_path, deep_remote, *flags, expect="deeper than")


def test_a_deep_chain_through_a_remote_view_is_refused(deep_remote):
    with pytest.raises(wvc.WvcError, match="deeper than"):
        wvc.open(str(deep_remote)).read_file("weights.bin")


def test_a_multi_gb_sparse_ref_file_is_refused_without_reading_it(tmp_path):
    raw = os.urandom(1024)
    name, data, index = pack_bytes([keyframe(raw)])
    remote = tmp_path / "remote"
    write_remote(remote, [ids.chunk_id(raw)], [(name, data, index)], len(raw))
    huge = remote / "refs" / "heads" / "huge"
    with open(huge, "wb") as fh:
        fh.truncate(2 << 30)  # sparse: costs no disk, 2 GB to whoever reads it whole
    assert_clone_refused(tmp_path, remote, expect="does not hold a commit id", max_rss_mb=150)


def test_a_hub_endpoint_that_ignores_range_never_sends_a_whole_pack(tmp_path, hub_env, cli):
    import torch
    from safetensors.torch import save_file

    repo = wvc.Repo.init(tmp_path / "m")
    big = torch.randn(4 << 20)  # 16 MB of incompressible fp32: the pack is that large
    save_file({"big": big, "small": torch.arange(16, dtype=torch.float32)}, str(repo.root / "model.safetensors"))
    repo.commit("v1")
    repo.remote_add("origin", "hf://team/no-range")
    repo.push()
    hub_env.ignore_range = True
    try:
        view = wvc.open("hf://team/no-range")
        with pytest.raises(wvc.WvcError, match="ignored a range request"):
            view.tensor("small")
        downloaded = view._get.remote.bytes_downloaded
        assert downloaded < 1 << 20, downloaded  # commit, tree, index: never the 16 MB pack
    finally:
        hub_env.ignore_range = False
    assert torch.equal(wvc.open("hf://team/no-range").tensor("small"), torch.arange(16, dtype=torch.float32))
