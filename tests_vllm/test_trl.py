"""TRL's AsyncGRPOTrainer syncs a real vLLM server through wvc (issue 51): the RL guide's
snippet, run as written (its server, model and remote names pointed at this test's, and the
config sized for a CPU), on a tiny Qwen2, a reward that varies, 3 optimizer steps with
weight_sync_steps=1 and a directory remote. After each sync the server reports the
trainer's commit; every synced version, loaded into the server, gives the greedy tokens,
top-5 and prompt logprobs of a fresh server started from ``wvc checkout`` of that commit,
and each differs from the one before. trl_on_cpu.py says where TRL itself needs CUDA and
what stands in for it here."""

import re
from pathlib import Path

import pytest
import torch

from wvc import Repo
from wvc.errors import WeightSyncError
from wvc.integrations.trl import WvcWeightTransfer
from wvc.integrations.vllm.server_client import VllmServer

from . import models, trl_on_cpu
from .engine import server
from .test_server import http_probe

GUIDE = Path(__file__).resolve().parent.parent / "docs" / "guides" / "rl.md"
STEPS = 3


def readme_snippet() -> str:
    text = GUIDE.read_text()
    section = text[text.index("## TRL's async GRPO"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


class ReportingTransfer(WvcWeightTransfer):
    """Records what the servers report right after each sync's load (in the background)."""

    reported: list

    def notify(self, servers=None, commit=None):
        seconds = super().notify(servers, commit)
        self.reported = getattr(self, "reported", []) + [[s.weight_version() for s in self.servers]]
        return seconds


def test_the_cpu_attention_is_causal_attention():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 7, 4, 8, generator=g) for _ in range(3))  # two segments of 7
    cu = torch.tensor([0, 7, 14])
    got = trl_on_cpu.flash_attn_varlen_func(q.reshape(14, 4, 8), k.reshape(14, 4, 8), v.reshape(14, 4, 8), cu, cu)
    want = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                            is_causal=True).transpose(1, 2).reshape(14, 4, 8)
    assert torch.allclose(got, want, atol=1e-6)


def test_async_grpo_syncs_a_vllm_server_through_wvc_every_step(tmp_path, monkeypatch):
    from transformers import AutoTokenizer
    from trl.chat_template_utils import qwen2_5_chat_template

    trl_on_cpu.install()
    start = tmp_path / "start"
    models.build(start, tied=True, dtype=torch.bfloat16)
    tokenizer = AutoTokenizer.from_pretrained(str(start))
    tokenizer.chat_template = qwen2_5_chat_template  # a template TRL's rollout worker knows
    tokenizer.save_pretrained(str(start))
    remote, staging = tmp_path / "remote", tmp_path / "staging"
    monkeypatch.chdir(tmp_path)  # the snippet's output_dir
    monkeypatch.setenv("WVC_CACHE", str(tmp_path / "cache"))
    from datasets import Dataset

    dataset = Dataset.from_dict({"prompt": ["the cat sat on", "one two three", "why did the dog", "a small cat"] * 8})
    with server(start, tmp_path / "server.log", wvc_backend=True, remote=remote) as base:
        before = http_probe(base, start)
        code = readme_snippet()
        for was, now in (("http://vllm-0:8000", base), ("Qwen/Qwen2.5-0.5B-Instruct", str(start)),
                         ("hf://buckets/team/runs/grpo-1", str(remote)),
                         ("WvcWeightTransfer(", f"ReportingTransfer(repo={str(staging)!r}, remote="),
                         ("AsyncGRPOConfig(", f"AsyncGRPOConfig(max_steps={STEPS}, per_device_train_batch_size=4, "
                          "num_generations=4, max_completion_length=8, learning_rate=1e-3, bf16=False, report_to=[], ")):
            assert was in code, was
            code = code.replace(was, now)
        scope = {"reward": trl_on_cpu.letter_reward, "dataset": dataset, "ReportingTransfer": ReportingTransfer}
        exec(compile(code, "docs/guides/rl.md", "exec"), scope)
        trainer = scope["trainer"]
        transfer = trainer.weight_transfer
        synced = [s["commit"] for s in transfer.syncs]
        # the cold sync at train begin, then one a step (in the background: one sent while
        # another ran and a newer one came is superseded, never published)
        assert len(synced) + transfer.superseded == 1 + STEPS
        assert transfer.reported == [[c] for c in synced]  # the server reports the trainer's commit
        log = {c.id: c for c in Repo.open(staging).log("main")}
        versions = [(log[c].metadata["model_version"], log[c].metadata["step"]) for c in synced]
        assert versions == sorted(versions) and set(versions) <= {(v + 1, v) for v in range(1 + STEPS)}
        assert versions[0] == (1, 0) and versions[-1] == (1 + STEPS, STEPS)  # the first and the last always
        assert trainer.rollout_worker.model_version == 1 + STEPS  # rollouts tagged with what the server holds
        assert transfer.syncs[0]["stored_bytes"] == 0  # the first sync is the start version: nothing new
        outputs = {synced[-1]: http_probe(base, start)}  # as the run left it
        client = VllmServer(base)
        for commit in reversed(synced[:-1]):  # then each earlier version, loaded back
            client.load(commit)
            outputs[commit] = http_probe(base, start)
    assert outputs[synced[0]] == before
    for previous, commit in zip(synced, synced[1:]):
        assert outputs[commit] != outputs[previous], "a step that changed nothing the server shows"
    checkout = Repo.open(staging)
    for commit in synced[1:]:
        fresh_dir = tmp_path / f"fresh-{commit[:12]}"
        checkout.checkout(commit, output=fresh_dir)
        with server(fresh_dir, tmp_path / f"fresh-{commit[:12]}.log", wvc_backend=False) as fresh:
            assert outputs[commit] == http_probe(fresh, fresh_dir), f"version {commit[:12]} differs from a fresh server"


def test_a_server_that_fails_a_sync_keeps_its_version_and_catches_up_on_the_next(tmp_path, monkeypatch):
    """Outside TRL (publish, then notify): a sync whose objects cannot be read (the step's pack
    gone from the remote) is one WeightSyncError naming the server and its reason; the server
    still reports and serves the version before, whole; the next sync moves it past the one it
    missed, equal to a fresh server on that commit."""
    monkeypatch.setenv("WVC_CACHE", str(tmp_path / "cache"))
    start = tmp_path / "start"
    sd = models.build(start, tied=False, dtype=torch.bfloat16)
    names = ["model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.up_proj.weight", "lm_head.weight"]
    remote = tmp_path / "remote"
    with server(start, tmp_path / "server.log", wvc_backend=True, remote=remote) as base:
        transfer = WvcWeightTransfer(str(remote), servers=[base], repo=tmp_path / "staging", start=start, timeout=120)
        transfer.init_weight_transfer()
        models.step(sd, names, seed=1)
        first = transfer.publish(sd)
        transfer.notify()
        held = http_probe(base, start)
        models.step(sd, names, seed=2)
        packs = set((remote / "packs").iterdir())
        missed = transfer.publish(sd)
        hidden = tmp_path / "hidden"
        hidden.mkdir()
        for pack in set((remote / "packs").iterdir()) - packs:
            pack.rename(hidden / pack.name)
        with pytest.raises(WeightSyncError) as failed:
            transfer.notify()
        assert failed.value.commit == missed and list(failed.value.failures) == [base]
        assert VllmServer(base).weight_version() == first
        assert http_probe(base, start) == held  # the version before, whole
        for pack in hidden.iterdir():
            pack.rename(remote / "packs" / pack.name)
        models.step(sd, names, seed=3)
        last = transfer.publish(sd)
        transfer.notify()
        assert VllmServer(base).weight_version() == last
        caught_up = http_probe(base, start)
    fresh_dir = tmp_path / "fresh"
    Repo.open(tmp_path / "staging").checkout(last, output=fresh_dir)
    with server(fresh_dir, tmp_path / "fresh.log", wvc_backend=False) as fresh:
        assert caught_up == http_probe(fresh, fresh_dir)
