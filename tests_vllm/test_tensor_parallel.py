"""A tensor-parallel engine (TP=2, two worker processes, the CPU backend's packed weights,
tied bf16) follows a branch: the workers share one follower (the first downloads and decodes
each step into one host copy in shared memory; each writes its shard from it), and after each
update the engine's greedy tokens, top-5 logprobs and prompt logprobs equal those of a fresh
TP=2 engine started from `wvc checkout` of the same commit (issue 65).

The engines run in a process of their own (this file, run as a module): worker processes
are started by vLLM's multiprocessing executor, which the in-process engines of the other
tests in this session must not share."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

from pathlib import Path

from . import engine
from .conftest import Trainer
from .test_server import _call, http_probe

SPAWN = {"VLLM_WORKER_MULTIPROC_METHOD": "spawn"}
STEPS = (["model.layers.0.self_attn.q_proj.weight", "model.embed_tokens.weight", "model.norm.weight"],
         ["model.layers.1.mlp.down_proj.weight", "model.layers.0.mlp.up_proj.weight"])


def drive(remote: str, first: str, start_dir: str, steps: list) -> dict:
    """A TP=2 engine started from ``start_dir`` (commit ``first``) follows ``remote`` through
    ``steps`` ([commit, checkout dir]); then a fresh TP=2 engine per step."""
    import gc

    from wvc.integrations.vllm import attach

    llm = engine.start_tp(start_dir)
    try:  # a version the engine's files are not: refused, and the engine's next calls are not disturbed
        attach(llm, remote, "main", at=steps[0][0])
        wrong_start = None
    except Exception as exc:  # noqa: BLE001 - what the test checks
        wrong_start = str(exc)[-300:]
    attached = attach(llm, remote, "main", at=first)
    out = {"wrong_start": wrong_start, "workers": len(attached.info()), "host_copies": [i["host_copy"] for i in attached.info()], "updates": []}
    try:  # a commit the remote lacks: the leader's error is the engine's, and every worker keeps its version
        attached.update("0" * 64)
        out["unknown"] = None
    except Exception as exc:  # noqa: BLE001 - what the test checks
        out["unknown"] = {"error": str(exc)[-300:], "held": [i["commit"] for i in attached.info()]}
    for commit, _ in steps:
        up = attached.update(commit)
        out["updates"].append({"commit": up.commit, "probe": engine.probe(llm), "applied": up.applied,
                               "held": [i["commit"] for i in attached.info()]})
    del attached, llm
    gc.collect()
    out["fresh"] = []
    for _, checkout in steps:
        fresh = engine.start_tp(checkout)
        out["fresh"].append(engine.probe(fresh))
        del fresh
        gc.collect()
    return out


def test_a_tensor_parallel_engine_follows_exactly(tmp_path):
    trainer = Trainer(tmp_path, tied=True, dtype=torch.bfloat16)
    start = trainer.checkout(trainer.first)
    steps = []
    for names in STEPS:
        commit = trainer.step(names)
        steps.append([commit, str(trainer.checkout(commit))])
    env = {**os.environ, **engine.ENGINE_ENV, "VLLM_ENABLE_V1_MULTIPROCESSING": "1",
           "VLLM_WORKER_MULTIPROC_METHOD": "spawn"}
    args = json.dumps([trainer.remote, trainer.first, str(start), steps])
    run = subprocess.run([sys.executable, "-m", "tests_vllm.test_tensor_parallel", args], env=env,
                         capture_output=True, text=True, timeout=600,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["wrong_start"] is not None and "does not hold version" in got["wrong_start"]
    assert got["workers"] == 2
    # one host copy for the server: the first worker fetches, both map the one shared file
    leader, member = got["host_copies"]
    assert leader["shared"] and member["shared"] and leader["name"] == member["name"]
    assert leader["fetches"] and not member["fetches"]
    assert got["unknown"] is not None and got["unknown"]["held"] == [trainer.first, trainer.first]
    assert "has no commit" in got["unknown"]["error"]
    before = None
    for (commit, _), update, fresh in zip(steps, got["updates"], got["fresh"]):
        assert update["commit"] == commit and update["held"] == [commit, commit]
        assert update["probe"] == fresh, "the TP=2 engine's outputs differ from a fresh TP=2 engine's"
        assert update["probe"] != before, "the step did not change the outputs: the test would not see a stale shard"
        before = update["probe"]
    # the first step's LM head (tied, its vocabulary split between the workers) was repacked
    assert "lm_head" in got["updates"][0]["applied"]["repacked"]


def _processes_mapping_host_copies(root_pid: int) -> dict[str, int]:
    """Of ``root_pid`` and its descendants: each shared host copy file they map, and how many
    of them map it."""
    files: dict[str, int] = {}
    for pid in engine.process_tree(root_pid):
        mapped = {line.split()[5] for line in Path(f"/proc/{pid}/maps").read_text().splitlines()
                  if "/wvc-host-" in line}
        for name in mapped:
            files[name] = files.get(name, 0) + 1
    return files


def test_a_tensor_parallel_server_follows_with_one_host_copy(tmp_path):
    """A TP=2 server with the wvc backend (the trainer's routes; on a server the leader prefetches
    while the engine serves, then every worker writes): both workers map one host copy, and
    after each update the server answers as a fresh TP=2 server on that commit does."""
    trainer = Trainer(tmp_path, tied=True, dtype=torch.bfloat16)
    start_dir = trainer.checkout(trainer.first)
    commits, outputs, procs = [], [], []
    with engine.server(start_dir, tmp_path / "server.log", wvc_backend=True, remote=trainer.remote, tp=2,
                       env_extra=SPAWN, started=procs) as base:
        status, r = _call(base + "/init_weight_transfer_engine", {"init_info": {"commit": trainer.first}})
        assert status == 200, r
        assert list(_processes_mapping_host_copies(procs[0].pid).values()) == [2]
        for names in STEPS:
            commit = trainer.step(names)
            for route, body in (("/pause", None), ("/start_weight_update", None),
                                ("/update_weights", {"update_info": {"commit": commit}}),
                                ("/finish_weight_update", {"weight_version": commit}), ("/resume", None)):
                status, r = _call(base + route, body)
                assert status == 200, (route, r)
            assert _call(base + "/weight_info", method="GET")[1]["weight_version"] == commit
            commits.append(commit)
            outputs.append(http_probe(base, start_dir))
        # a commit the remote lacks: the route's error, and the server keeps its version
        assert _call(base + "/start_weight_update")[0] == 200
        status, r = _call(base + "/update_weights", {"update_info": {"commit": "0" * 64}})
        assert status != 200 and "has no commit" in json.dumps(r), r
        assert _call(base + "/weight_info", method="GET")[1]["weight_version"] == commits[-1]
        assert http_probe(base, start_dir) == outputs[-1]
    assert outputs[0] != outputs[1]
    for commit, got in zip(commits, outputs):
        fresh_dir = trainer.checkout(commit)
        with engine.server(fresh_dir, tmp_path / "fresh.log", wvc_backend=False, tp=2, env_extra=SPAWN) as base:
            assert got == http_probe(base, fresh_dir), "the TP=2 server's outputs differ from a fresh TP=2 server's"


if __name__ == "__main__":
    remote, first, start_dir, steps = json.loads(sys.argv[1])
    print(json.dumps(drive(remote, first, start_dir, steps)), flush=True)
