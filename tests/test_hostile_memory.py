"""Memory a hostile remote can make a reader take is bounded (issue 49, item 4).

Each reader runs in its own process under an address-space limit (RLIMIT_AS), and its peak
resident memory is measured (VmHWM) against the same reader on an honest remote. Before
the fix: a 5.7 KB catalog of ``[{"":[]},...]`` took a clone to 2.36 GB; a follower read a
1.5 GiB sparse step record whole, and fetched 8 ranges of 200 MiB before decoding any."""

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import zstandard

import wvc
from wvc.remotes.layout import step_path
from wvc.remotes import step_records
from wvc.remotes.catalog import MAGIC, catalog_name

REPO_ROOT = Path(__file__).parent.parent
LIMIT_MB = 1536  # the address-space limit each reader runs under (an honest clone or follow needs ~300-600)
PEAK_MB = 400  # the stated bound on a reader's peak RSS against any of these hostile objects

READER = r"""
import atexit, json, resource, sys
limit = int(sys.argv[1]) << 20
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
def peak():  # VmHWM: this process's own high-water mark (ru_maxrss keeps the forking parent's across exec)
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            print("PEAK", int(line.split()[1]) // 1024, flush=True)
atexit.register(peak)
what, args = sys.argv[2], sys.argv[3:]
import wvc
from wvc.errors import WvcError
try:
    if what == "clone":
        wvc.clone(args[0], args[1])
        print("RESULT ok")
    else:
        f = wvc.follow(args[0])
        f.commit, f._tree = None, None
        held = f.update(rev=args[1], timeout=30)  # the first version, the ordinary way
        update = f.update(timeout=30)  # then the tip: by its step record
        print("RESULT", json.dumps({"commit": f.commit, "digest": {k: v.view(-1).view(__import__("torch").uint8).sum().item() for k, v in f.state_dict.items()}}))
except WvcError as exc:
    print("REFUSED", str(exc).splitlines()[0])
"""


def _reader(*args) -> tuple[str, int]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "MALLOC_ARENA_MAX": "2", "WVC_CODEC_THREADS": "2"}
    r = subprocess.run([sys.executable, "-c", READER, str(LIMIT_MB), *map(str, args)], capture_output=True, text=True,
                       env=env, timeout=600)
    peak = next((int(l.split()[1]) for l in r.stdout.splitlines() if l.startswith("PEAK")), None)
    outcome = next((l for l in r.stdout.splitlines() if l.startswith(("RESULT", "REFUSED"))), None)
    assert peak is not None and outcome is not None, (r.returncode, r.stdout[-2000:], r.stderr[-3000:])
    return outcome, peak


def _run(tmp_path, steps_n=2):
    repo = wvc.Repo.init(tmp_path / "src", chunk_bytes=1 << 16)
    g = torch.Generator().manual_seed(0)
    sd = {f"w{i}": torch.randn(1 << 16, generator=g) for i in range(4)}
    commits = []
    for s in range(steps_n):
        sd["w1"].view(-1)[s::97] += 1e-3
        commits.append(repo.commit(f"step {s}", sd).commit)
    remote = tmp_path / "remote"
    repo.remote_add("origin", str(remote))
    repo.push()
    return repo, remote, commits


def test_a_dense_catalog_header_is_refused_before_it_can_amplify(tmp_path):
    repo, remote, _ = _run(tmp_path)
    honest, honest_peak = _reader("clone", remote, tmp_path / "honest")
    assert honest == "RESULT ok"
    meta = b'{"pack": null, "entries": [' + b'{"":[]},' * (60 << 17) + b'{"":[]}], "objects": []}'  # 60 MiB
    data = zstandard.ZstdCompressor().compress(MAGIC + struct.pack("<I", len(meta)) + meta)
    assert len(data) < 64 << 10  # a few KB on the wire
    (remote / "catalogs" / f"{catalog_name(data)}.cat").write_bytes(data)
    outcome, peak = _reader("clone", remote, tmp_path / "hostile")
    print(f"clone: honest peak {honest_peak} MB, hostile catalog peak {peak} MB")
    assert outcome.startswith("REFUSED") and "denser than any wvc writes" in outcome, outcome
    assert peak < PEAK_MB and peak < honest_peak + 150, (peak, honest_peak)


def _replace_record(remote, commit, record: bytes, *, size: int | None = None):
    path = remote / step_path(commit)
    path.write_bytes(record)
    if size is not None:
        with open(path, "r+b") as fh:
            fh.truncate(size)  # sparse: no disk, but a reader that reads it whole holds it all


def test_a_huge_sparse_step_record_is_read_by_ranges_and_the_follower_is_exact(tmp_path):
    repo, remote, commits = _run(tmp_path)
    path = remote / step_path(commits[-1])
    assert path.exists()
    honest, honest_peak = _reader("follow", remote, commits[0])
    _replace_record(remote, commits[-1], path.read_bytes(), size=int(1.5 * (1 << 30)))
    outcome, peak = _reader("follow", remote, commits[0])
    print(f"follower: honest peak {honest_peak} MB, 1.5 GiB record peak {peak} MB")
    assert outcome == honest and json.loads(outcome[7:])["commit"] == commits[-1]
    assert peak < PEAK_MB and peak < honest_peak + 100, (peak, honest_peak)


def test_step_record_ranges_of_200_mib_are_decoded_as_they_arrive(tmp_path):
    repo, remote, commits = _run(tmp_path)
    record = step_records.parse((remote / step_path(commits[-1])).read_bytes(), commits[-1])
    honest, honest_peak = _reader("follow", remote, commits[0])
    big = "ab" * 32
    with open(remote / "packs" / f"pack-{big}.pack", "wb") as fh:
        fh.truncate(8 * (200 << 20) + 64)
    lying = [(c.id, c.base, c.context, c.raw_size, big, 16 + k * (200 << 20), 200 << 20, None)
             for k, c in enumerate(record.chunks[:8])]
    assert lying
    _replace_record(remote, commits[-1], step_records.build(record.commit, record.parent, record.commit_bytes,
                                                     record.tree_bytes, record.tree_diff, lying))
    outcome, peak = _reader("follow", remote, commits[0])
    print(f"follower: honest peak {honest_peak} MB, {len(lying)} x 200 MiB ranges peak {peak} MB")
    assert outcome == honest  # the record is unusable; the version is read the ordinary way, exactly
    assert peak < 200 + PEAK_MB, (peak, honest_peak)  # one range in memory at a time, never all


def test_a_dense_step_record_header_is_refused_and_the_follower_reads_the_version(tmp_path):
    repo, remote, commits = _run(tmp_path)
    honest, honest_peak = _reader("follow", remote, commits[0])
    header = b'{"chunks": [' + b'{"":[]},' * (60 << 17) + b'{"":[]}], "commit": "x"}'  # 60 MiB of structure
    frame = zstandard.ZstdCompressor().compress(header)
    _replace_record(remote, commits[-1], step_records.MAGIC + struct.pack("<Q", len(frame)) + frame)
    outcome, peak = _reader("follow", remote, commits[0])
    print(f"follower: honest peak {honest_peak} MB, dense record header peak {peak} MB")
    assert outcome == honest  # refused unparsed; the version read the ordinary way, exactly
    assert peak < PEAK_MB and peak < honest_peak + 150, (peak, honest_peak)
