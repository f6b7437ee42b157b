"""The workers of one tensor-parallel server share one follower (issue 65): the group's leader
downloads and decodes each step into one host copy in shared memory, the others map the same
memory and write their shards from it. Real processes over gloo (tests/shared_follower_worker.py);
the engine is a stand-in that keeps each worker's shard of every tensor (vLLM's TP=2 engine:
tests_vllm/test_tensor_parallel.py)."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from .test_dcp import free_port
from .test_follow import Publisher

ROOT = Path(__file__).resolve().parent.parent
WORLD = 2

pytestmark = pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="no /dev/shm")


def shards(sd: dict) -> list[dict]:
    """Each worker's shard digests of a state dict (what ShardEngine.digest reports)."""
    return [{name: hashlib.sha256(t.reshape(-1).view(torch.uint8).chunk(WORLD)[r].numpy().tobytes()).hexdigest()
             for name, t in sorted(sd.items())} for r in range(WORLD)]


def run_workers(args: dict, tmp_path) -> list[dict]:
    args = {**args, "out": str(tmp_path / "report")}
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "WVC_CACHE": str(tmp_path / "cache")}
    procs = [subprocess.Popen([sys.executable, "-m", "tests.shared_follower_worker", str(r), str(WORLD), str(port),
                               json.dumps(args)], env=env, cwd=ROOT, stderr=subprocess.PIPE, text=True)
             for r in range(WORLD)]
    codes = [p.wait(timeout=300) for p in procs]
    assert codes == [0] * WORLD, [p.stderr.read()[-3000:] for p in procs]
    return [json.loads(Path(f"{args['out']}.{r}.json").read_text()) for r in range(WORLD)]


def published(tmp_path, monkeypatch, steps: int):
    """A remote with a start version (checked out into a directory, as an engine's model)
    and ``steps`` more; each version's shard digests."""
    monkeypatch.setenv("WVC_CACHE", str(tmp_path / "cache"))
    pub = Publisher(tmp_path / "trainer", str(tmp_path / "remote"))
    first, _ = pub.step("start")
    model = tmp_path / "model"
    model.mkdir()
    shutil.copy(pub.repo.root / "model.safetensors", model / "model.safetensors")
    commits, expected = [], []
    for k in range(steps):
        commit, _ = pub.step(f"step {k}", touch=("layer0.weight", "layer3.weight", "norm.weight"))
        commits.append(commit)
        expected.append(shards({n: t.clone() for n, t in pub.sd.items()}))
    return {"remote": str(tmp_path / "remote"), "model": str(model), "first": first, "steps": commits,
            "unknown": "0" * 64}, expected


def test_one_worker_fetches_into_one_shared_host_copy_and_every_shard_is_exact(tmp_path, monkeypatch):
    args, expected = published(tmp_path, monkeypatch, steps=3)
    reports = run_workers(args, tmp_path)
    leader, member = reports
    # one follower, one host copy: both workers map the one file the leader made (unlinked)
    assert leader["follower"] and not member["follower"]
    assert leader["info"]["host_copy"]["shared"] and member["info"]["host_copy"]["shared"]
    assert leader["info"]["host_copy"]["name"] == member["info"]["host_copy"]["name"]
    assert leader["mappings"] == member["mappings"] and len(leader["mappings"]) == 1
    assert leader["info"]["commit"] == member["info"]["commit"] == args["first"]
    # a start at a version the engine's files are not is refused once, by the last worker, and the
    # group's next start (and every call after it) works
    assert leader["wrong_start"] == {"failed": "InvalidArgument"}
    assert member["wrong_start"]["raised"][0] == "InvalidArgument"
    assert "does not hold version" in member["wrong_start"]["raised"][1]
    # the leader's failure (a commit the remote lacks) is the last worker's to raise (vLLM reads
    # replies in rank order and stops at the first failed one), and each keeps its version
    assert member["unknown"]["raised"][0] == "RevisionNotFound" and "has no commit" in member["unknown"]["raised"][1]
    assert leader["unknown"] == {"returned": None, "held": args["first"]}
    assert member["unknown"]["held"] == args["first"]
    # each step: both workers' shards equal the trainer's tensors', byte for byte
    for k, commit in enumerate(args["steps"]):
        for rank, report in enumerate(reports):
            step = report["steps"][k]
            assert "error" not in step, step
            assert step["held"] == commit and step["update"]["commit"] == commit
            assert step["digest"] == expected[k][rank]
    assert leader["downloaded"] > 0 and member["downloaded"] == 0
    # the others are sent the changed elements' indices only of tensors they patch (not of those
    # every worker reloads whole); the leader's own update keeps them all
    for k in range(len(args["steps"])):
        assert leader["steps"][k]["update"]["indices_of"] == ["layer0.weight", "layer3.weight", "norm.weight"]
        assert member["steps"][k]["update"]["indices_of"] == ["norm.weight"]
        assert member["steps"][k]["patched"] == ["norm.weight"]


@pytest.mark.parametrize("fail_rank", [0, 1])
def test_a_write_that_fails_on_one_worker_makes_the_server_unusable_and_no_worker_waits(tmp_path, monkeypatch,
                                                                                        fail_rank):
    """A write that fails on one worker (its shard part old, part new) makes the whole server
    unusable: every worker says so from then on, the last one raises (as above), none waits
    forever on another, and the worker whose write went in holds the new shard exactly."""
    args, expected = published(tmp_path, monkeypatch, steps=2)
    reports = run_workers({**args, "fail_rank": fail_rank, "fail_on": 1}, tmp_path)
    leader, member = reports
    for report in reports:
        assert report["steps"][0]["unusable"] and report["steps"][1]["unusable"]
    assert member["steps"][0]["error"][0] == "EngineUnusable"
    assert member["steps"][1]["error"][0] == "EngineUnusable"
    assert "error" not in leader["steps"][0] and "error" not in leader["steps"][1]
    assert leader["steps"][0]["update"] is None and leader["steps"][1]["update"] is None
    written = 1 - fail_rank
    assert reports[written]["steps"][0]["digest"] == expected[0][written]
    assert reports[fail_rank]["steps"][0]["digest"] != expected[0][fail_rank]


def test_without_shared_memory_each_worker_follows_alone_and_exactly(tmp_path, monkeypatch):
    """Where the leader cannot make the shared file (no /dev/shm, or one too small), every
    worker keeps its own host copy and follower, as before: each downloads, and each shard is
    exact."""
    args, expected = published(tmp_path, monkeypatch, steps=2)
    reports = run_workers({**args, "shm_dir": str(tmp_path / "no-shm-here")}, tmp_path)
    for rank, report in enumerate(reports):
        assert report["follower"] and not report["info"]["host_copy"]["shared"] and not report["mappings"]
        assert report["downloaded"] > 0
        for k, step in enumerate(report["steps"]):
            assert step["held"] == args["steps"][k] and step["digest"] == expected[k][rank]
