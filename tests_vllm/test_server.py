"""A vLLM server started with `--weight-transfer-config '{"backend": "wvc"}'` (the backend
registered by wvc's vllm.general_plugins entry point) follows a branch through vLLM's own
routes: the trainer sends commit ids. Untied bf16 weights on the CPU backend's packed layout
(the LM head's own packed copy rebuilt). Compared with a fresh server on the same commit."""

import json
import urllib.error
import urllib.request

import pytest
import torch

from . import engine
from .engine import server
from .conftest import Trainer


def _call(url: str, body: dict | None = None, method: str = "POST") -> tuple[int, dict]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method if body is not None or method == "POST" else method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        text = e.read()
        try:
            return e.code, json.loads(text)
        except ValueError:
            return e.code, {"error": text.decode(errors="replace")}


def http_probe(base: str, model_dir) -> list:
    out = []
    for prompt in engine.PROMPTS:
        status, r = _call(base + "/v1/completions", {
            "model": str(model_dir), "prompt": prompt, "max_tokens": 8, "temperature": 0, "logprobs": 5,
            "prompt_logprobs": 5, "return_tokens_as_token_ids": True, "seed": 0})
        assert status == 200, r
        c = r["choices"][0]
        out.append({"text": c["text"], "top": c["logprobs"]["top_logprobs"], "prompt": c.get("prompt_logprobs")})
    return out


def test_a_server_follows_the_branch_through_vllms_routes(tmp_path):
    trainer = Trainer(tmp_path, tied=False, dtype=torch.bfloat16)
    start_dir = trainer.checkout(trainer.first)
    with server(start_dir, tmp_path / "server.log", wvc_backend=True, remote=trainer.remote) as base:
        before = http_probe(base, start_dir)
        status, r = _call(base + "/init_weight_transfer_engine",
                          {"init_info": {"remote": trainer.remote, "branch": "main", "commit": trainer.first}})
        assert status == 200, r
        assert _call(base + "/weight_info", method="GET")[1]["weight_version"] == trainer.first
        commit = trainer.step(["model.layers.0.self_attn.q_proj.weight", "lm_head.weight",
                               "model.layers.1.mlp.down_proj.weight"])
        assert _call(base + "/pause")[0] == 200  # as a trainer does: in-flight requests out, caches cleared
        assert _call(base + "/start_weight_update")[0] == 200
        status, r = _call(base + "/update_weights", {"update_info": {}})  # no commit: the branch's tip
        assert status == 200, r
        status, r = _call(base + "/finish_weight_update", {"weight_version": commit})
        assert status == 200, r
        assert _call(base + "/resume")[0] == 200
        assert _call(base + "/weight_info", method="GET")[1]["weight_version"] == commit
        after = http_probe(base, start_dir)
        # a weight_version naming another commit than the one loaded is refused, not reported
        assert _call(base + "/start_weight_update")[0] == 200
        assert _call(base + "/update_weights", {"update_info": {"commit": commit}})[0] == 200
        status, r = _call(base + "/finish_weight_update", {"weight_version": trainer.first})
        assert status != 200
        assert _call(base + "/weight_info", method="GET")[1]["weight_version"] == commit
    assert after != before
    fresh_dir = trainer.checkout(commit)
    with server(fresh_dir, tmp_path / "fresh.log", wvc_backend=False) as base:
        want = http_probe(base, fresh_dir)
    assert after == want, "the updated server's outputs differ from a fresh server's on the same commit"
