"""The training integration: a real transformers Trainer with WvcCallback."""

import hashlib

import pytest
import torch

transformers = pytest.importorskip("transformers")

from wvc import Repo, clone  # noqa: E402
from wvc.integrations.transformers import WvcCallback  # noqa: E402


class TokenDataset(torch.utils.data.Dataset):
    def __init__(self, n=64, seq=16, vocab=100):
        g = torch.Generator().manual_seed(0)
        self.items = [torch.randint(0, vocab, (seq,), generator=g) for _ in range(n)]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return {"input_ids": self.items[i], "labels": self.items[i]}


def tiny_trainer(output_dir, callback, max_steps=6, save_steps=2):
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=100, n_positions=32, bos_token_id=0, eos_token_id=0))
    args = TrainingArguments(output_dir=str(output_dir), max_steps=max_steps, save_steps=save_steps,
                             per_device_train_batch_size=4, logging_steps=1, report_to=[], use_cpu=True,
                             learning_rate=1e-3, save_strategy="steps", disable_tqdm=True)
    return Trainer(model=model, args=args, train_dataset=TokenDataset(), callbacks=[callback])


def sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_callback_commits_every_save_exactly_and_pushes_them_all(tmp_path, hub_env):
    cb = WvcCallback(tmp_path / "versions", push_to="hf://team/run", branch="run/tiny")
    tiny_trainer(tmp_path / "out", cb).train()
    assert [c["step"] for c in cb.commits] == [2, 4, 6]
    repo = Repo.open(tmp_path / "versions")
    assert repo.branches()["run/tiny"] == cb.commits[-1]["commit"]
    for c in cb.commits:
        info = repo.show(c["commit"])
        assert info["metadata"]["step"] == c["step"] and info["metadata"]["epoch"] > 0
        assert "loss" in info["metadata"]["metrics"]
        assert "optimizer.pt" not in [f["path"] for f in info["files"]]
        out = tmp_path / f"check-{c['step']}"
        repo.checkout(c["commit"], output=out)
        saved = tmp_path / "out" / f"checkpoint-{c['step']}"
        assert sha(out / "model.safetensors") == sha(saved / "model.safetensors")
        assert sha(out / "config.json") == sha(saved / "config.json")
    assert cb.push_errors == []
    copy = clone("hf://team/run", tmp_path / "copy", branch="run/tiny")
    assert copy.head() == cb.commits[-1]["commit"]
    assert [e.id for e in copy.log()] == [c["commit"] for c in reversed(cb.commits)]


def test_push_failures_are_retried_and_never_block_or_lose_commits(tmp_path, hub_env):
    hub_env.fail["commit"] = 2  # the first two pushes fail
    cb = WvcCallback(tmp_path / "versions", push_to="hf://team/flaky", branch="run/flaky", retry_seconds=0.01)
    tiny_trainer(tmp_path / "out", cb).train()
    assert len(cb.push_errors) >= 1
    copy = clone("hf://team/flaky", tmp_path / "copy", branch="run/flaky")
    assert copy.head() == cb.commits[-1]["commit"]


def test_every_n_steps_commits_from_memory(tmp_path):
    cb = WvcCallback(tmp_path / "versions", every_n_steps=1, on_save=False, max_pending=100)
    trainer = tiny_trainer(tmp_path / "out", cb, max_steps=3, save_steps=100)
    trainer.train()
    assert [c["step"] for c in cb.commits] == [0, 1, 2, 3]  # the weights the run started from, then each step
    repo = Repo.open(tmp_path / "versions")
    weights = repo.load_state_dict(cb.commits[-1]["commit"])
    live = trainer.model.state_dict()
    assert "lm_head.weight" not in weights  # tied to the embeddings: stored once, as save_pretrained does
    for name, t in live.items():
        if name == "lm_head.weight":
            continue
        assert torch.equal(weights[name].view(torch.uint8), t.detach().contiguous().view(torch.uint8)), name


def test_every_n_steps_commits_carry_their_own_steps_metrics(tmp_path):
    """on_step_end runs before the Trainer logs that step: the commit waits for the log."""
    cb = WvcCallback(tmp_path / "versions", every_n_steps=1, on_save=False, max_pending=100)
    trainer = tiny_trainer(tmp_path / "out", cb, max_steps=3, save_steps=100)
    trainer.train()
    repo = Repo.open(tmp_path / "versions")
    logged = {e["step"]: e["loss"] for e in trainer.state.log_history if "loss" in e}
    assert sorted(logged) == [1, 2, 3]
    assert [c["step"] for c in cb.commits] == [0, 1, 2, 3]
    for c in cb.commits[1:]:
        meta = repo.read_commit(c["commit"]).metadata
        assert meta["step"] == c["step"] and meta["metrics"]["loss"] == logged[c["step"]], (c, meta)


def test_two_runs_with_the_same_output_dir_name_get_their_own_branches(tmp_path):
    first = WvcCallback(tmp_path / "versions", every_n_steps=1, on_save=False, max_pending=100)
    tiny_trainer(tmp_path / "a" / "out", first, max_steps=2, save_steps=100).train()
    second = WvcCallback(tmp_path / "versions", every_n_steps=1, on_save=False, max_pending=100)
    tiny_trainer(tmp_path / "b" / "out", second, max_steps=2, save_steps=100).train()
    assert first.branch != second.branch
    repo = Repo.open(tmp_path / "versions")
    first_of_run_2 = repo.read_commit(second.commits[0]["commit"])
    assert first.commits[-1]["commit"] not in first_of_run_2.parents  # run 2 does not continue run 1
    assert set(repo.branches()) >= {first.branch, second.branch}


def test_the_flush_at_train_end_is_bounded_when_the_hub_is_unreachable(tmp_path, monkeypatch):
    import socket
    import time

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("HF_TOKEN", "x")
    cb = WvcCallback(tmp_path / "versions", push_to="hf://team/offline", branch="run/offline",
                     retry_seconds=30.0, flush_timeout=0.5)
    trainer = tiny_trainer(tmp_path / "out", cb, max_steps=2, save_steps=2)
    t = time.perf_counter()
    trainer.train()
    assert time.perf_counter() - t < 20  # the retries alone would take 30 s and more
    assert cb.unpushed and "wvc push origin run/offline" in cb.push_errors[-1]
    assert Repo.open(tmp_path / "versions").branches()["run/offline"] == cb.commits[-1]["commit"]  # nothing lost
