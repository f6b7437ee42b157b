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

from . import engine
from .conftest import Trainer

STEPS = (["model.layers.0.self_attn.q_proj.weight", "model.embed_tokens.weight", "model.norm.weight"],
         ["model.layers.1.mlp.down_proj.weight", "model.layers.0.mlp.up_proj.weight"])


def _tp_engine(model_dir: str):
    from vllm import LLM

    return LLM(model=model_dir, **{**engine.engine_kwargs(), "distributed_executor_backend": "mp",
                                   "tensor_parallel_size": 2})


def drive(remote: str, first: str, start_dir: str, steps: list) -> dict:
    """A TP=2 engine started from ``start_dir`` (commit ``first``) follows ``remote`` through
    ``steps`` ([commit, checkout dir]); then a fresh TP=2 engine per step."""
    import gc

    from wvc.integrations.vllm import attach

    llm = _tp_engine(start_dir)
    attached = attach(llm, remote, "main", at=first)
    out = {"workers": len(attached.info()), "host_copies": [i["host_copy"] for i in attached.info()], "updates": []}
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
        fresh = _tp_engine(checkout)
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


if __name__ == "__main__":
    remote, first, start_dir, steps = json.loads(sys.argv[1])
    print(json.dumps(drive(remote, first, start_dir, steps)), flush=True)
