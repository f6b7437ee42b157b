"""From-memory commits of a TRL SFTTrainer run are what save_pretrained writes at that step
(issue #16, findings 1-7): one test or more per finding, each with a real SFTTrainer."""

import hashlib
import json
import threading

import pytest
import torch

pytest.importorskip("trl")

from tests import trl_helpers  # noqa: E402
from wvc import Repo  # noqa: E402
from wvc.integrations.transformers import CHECKPOINT_EXCLUDES, WvcCallback  # noqa: E402


def sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def every_step(tmp_path, **kw):
    return WvcCallback(tmp_path / "versions", every_n_steps=1, max_pending=100, **kw)


def files_of(repo, commit, out):
    repo.checkout(commit, output=out)
    return sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())


def test_from_memory_commits_carry_nothing_stale_from_a_checkpoint(tmp_path):
    """Finding 1: a step-3 commit after checkpoint 2 held checkpoint 2's trainer_state.json."""
    cb = every_step(tmp_path)
    trl_helpers.sft_trainer(tmp_path / "out", cb, max_steps=4, save_steps=2).train()
    repo = Repo.open(tmp_path / "versions")
    for c in cb.commits:
        out = tmp_path / f"v{c['step']}"
        files_of(repo, c["commit"], out)
        state = out / "trainer_state.json"
        if state.exists():
            assert json.loads(state.read_text())["global_step"] == c["step"], c
    assert [c["step"] for c in cb.commits] == [0, 1, 2, 3, 4]  # 2 and 4 are the checkpoints' commits


def test_peft_from_memory_commits_hold_the_adapter_of_their_own_step(tmp_path):
    """Findings 1 and 2: with PEFT, a from-memory commit held the whole PeftModel state dict
    as model.safetensors (or checkpoint 2's adapter under a step-3 label)."""
    from peft import PeftModel

    cb = every_step(tmp_path)
    trainer = trl_helpers.sft_trainer(tmp_path / "out", cb, max_steps=3, save_steps=2, peft=True)
    trainer.train()
    repo = Repo.open(tmp_path / "versions")
    last = cb.commits[-1]
    assert last["step"] == 3
    names = files_of(repo, last["commit"], tmp_path / "v3")
    assert "adapter_model.safetensors" in names and "adapter_config.json" in names
    assert "model.safetensors" not in names
    assert (tmp_path / "v3" / "adapter_model.safetensors").stat().st_size < 100_000  # the adapter alone
    trainer.model.save_pretrained(tmp_path / "saved")
    assert sha(tmp_path / "v3" / "adapter_model.safetensors") == sha(tmp_path / "saved" / "adapter_model.safetensors")
    for c in cb.commits:  # every commit of the run loads, with its own step's adapter
        out = tmp_path / f"load{c['step']}"
        repo.checkout(c["commit"], output=out)
        loaded = PeftModel.from_pretrained(trl_helpers.model(), out)
        adapter = {k: v for k, v in loaded.state_dict().items() if "lora_" in k}
        assert adapter, "no adapter loaded"
    live = {k: v for k, v in trainer.model.state_dict().items() if "lora_" in k}
    assert all(torch.equal(adapter[k].view(torch.uint8), live[k].contiguous().view(torch.uint8)) for k in live)


def test_the_run_starts_with_a_loadable_commit_of_its_start_weights(tmp_path):
    """Finding 3: commits before the first save held only model.safetensors (no config), and
    the step-0 weights were never committed."""
    from transformers import AutoModelForCausalLM

    cb = every_step(tmp_path)
    trainer = trl_helpers.sft_trainer(tmp_path / "out", cb, max_steps=2, lr=1e-5, dtype=torch.bfloat16)
    start = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    trainer.train()
    repo = Repo.open(tmp_path / "versions")
    assert cb.commits[0]["step"] == 0
    for c in cb.commits:
        out = tmp_path / f"v{c['step']}"
        names = files_of(repo, c["commit"], out)
        assert {"config.json", "generation_config.json", "tokenizer.json", "model.safetensors"} <= set(names), names
        loaded = AutoModelForCausalLM.from_pretrained(out)
        if c["step"] == 0:
            got = loaded.state_dict()
            assert all(torch.equal(got[k], start[k]) for k in start)
    # the first step's commit is a delta against the start, not a full copy
    assert cb.commits[1]["stored_bytes"] < 0.5 * cb.commits[0]["stored_bytes"]


def test_metrics_belong_to_the_step_committed(tmp_path):
    """Finding 4: on_step_end runs before the step is logged."""
    cb = every_step(tmp_path)
    trainer = trl_helpers.sft_trainer(tmp_path / "out", cb, max_steps=3)
    trainer.train()
    repo = Repo.open(tmp_path / "versions")
    logged = {e["step"]: e["loss"] for e in trainer.state.log_history if "loss" in e}
    for c in cb.commits[1:]:
        assert repo.read_commit(c["commit"]).metadata["metrics"]["loss"] == logged[c["step"]]


@pytest.mark.parametrize("kind", ["plain", "tied", "peft"])
def test_a_from_memory_commit_equals_save_model_of_the_same_weights(tmp_path, kind):
    """Finding 5: from-memory commits added a duplicate lm_head.weight and lacked the
    {"format": "pt"} metadata; a from-memory commit and a saved checkpoint of the same
    weights now have the same tree id."""
    cb = every_step(tmp_path, branch="run/mem")
    trainer = trl_helpers.sft_trainer(tmp_path / "out", cb, max_steps=2, save_steps=None, tied=kind != "plain",
                                      peft=kind == "peft")
    trainer.train()
    trainer.save_model(str(tmp_path / "saved"))  # the Trainer's own save, same weights as step 2
    repo = Repo.open(tmp_path / "versions")
    saved = repo.commit("saved", source=tmp_path / "saved", branch="saved", exclude=CHECKPOINT_EXCLUDES)
    assert repo.read_commit(cb.commits[-1]["commit"]).tree == saved.tree
    if kind == "tied":
        assert "lm_head.weight" not in repo.load_state_dict(cb.commits[-1]["commit"])


def test_alternating_checkpoint_and_from_memory_commits_do_not_restore_the_tied_head(tmp_path):
    """Finding 5: a from-memory commit after a checkpoint re-stored lm_head (tied) whole."""
    cb = every_step(tmp_path)
    trainer = trl_helpers.sft_trainer(tmp_path / "out", cb, max_steps=4, save_steps=2, lr=1e-5, dtype=torch.bfloat16)
    trainer.train()
    repo = Repo.open(tmp_path / "versions")
    step = {c["step"]: c for c in cb.commits}
    head_bytes = trainer.model.lm_head.weight.nbytes
    three = repo.tree_of(step[3]["commit"])
    two = repo.tree_of(step[2]["commit"])
    # a step's change, not the tied head stored again whole
    assert step[3]["stored_bytes"] < head_bytes / 4, (step[3]["stored_bytes"], head_bytes)
    assert {f.path for f in three.files} == {f.path for f in two.files} - {"trainer_state.json"}


def test_two_runs_with_the_same_output_dir_name_get_their_own_branches(tmp_path):
    """Finding 6."""
    first, second = every_step(tmp_path), every_step(tmp_path)
    trl_helpers.sft_trainer(tmp_path / "a" / "out", first, max_steps=1).train()
    trl_helpers.sft_trainer(tmp_path / "b" / "out", second, max_steps=1).train()
    assert first.branch != second.branch
    repo = Repo.open(tmp_path / "versions")
    assert first.commits[-1]["commit"] not in repo.read_commit(second.commits[0]["commit"]).parents


def test_the_flush_at_train_end_is_bounded_when_the_hub_is_unreachable(tmp_path, monkeypatch):
    """Finding 7: with the Hub unreachable on_train_end held train() for ~24 s of retries."""
    import socket
    import time

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("HF_TOKEN", "x")
    cb = every_step(tmp_path, push_to="hf://team/offline", branch="run/offline", retry_seconds=30.0,
                    flush_timeout=1.0)
    trainer = trl_helpers.sft_trainer(tmp_path / "out", cb, max_steps=2)
    t = time.perf_counter()
    trainer.train()
    assert time.perf_counter() - t < 20
    assert cb.unpushed
    assert Repo.open(tmp_path / "versions").branches()["run/offline"] == cb.commits[-1]["commit"]


def test_a_slow_commit_coalesces_to_the_newest_step_and_records_the_skipped_ones(tmp_path, monkeypatch):
    """The queue is bounded: while a commit is slow, newer snapshots replace the waiting one;
    the commit that lands says which steps it stands for. Training never waits on it."""
    from wvc import api

    release = threading.Event()
    real = api.Repo.commit
    started = []

    def slow_commit(self, *a, **kw):
        started.append(kw.get("metadata", {}).get("step"))
        if len(started) == 1:
            release.wait(timeout=60)  # hold the first commit (step 0) until training is done
        return real(self, *a, **kw)

    monkeypatch.setattr(api.Repo, "commit", slow_commit)

    class Release(WvcCallback):
        def on_train_end(self, *a, **kw):
            release.set()
            super().on_train_end(*a, **kw)

    cb = Release(tmp_path / "versions", every_n_steps=1, max_pending=1)
    trainer = trl_helpers.sft_trainer(tmp_path / "out", cb, max_steps=4, save_steps=None)
    trainer.train()
    assert [c["step"] for c in cb.commits] == [0, 4], (started, cb.commits)  # 1, 2, 3 waited and were replaced
    assert cb.commits[-1]["skipped_steps"] == [1, 2, 3]
    repo = Repo.open(tmp_path / "versions")
    assert repo.read_commit(cb.commits[-1]["commit"]).metadata["skipped_steps"] == [1, 2, 3]
    assert len(cb.pauses) == 5  # every snapshot was taken; none waited for a commit
    live = trainer.model.state_dict()
    got = repo.load_state_dict(cb.commits[-1]["commit"])
    assert all(torch.equal(got[k], live[k]) for k in got)


def test_fsdp_ranks_all_take_part_and_rank_0_commits_the_full_weights(tmp_path):
    """Finding 8: under FSDP, reading the weights on rank 0 alone hangs or gives its shard;
    every rank now takes part in gathering them (two real processes, FSDP2 on gloo)."""
    import os
    import socket
    import subprocess
    import sys
    from pathlib import Path

    from safetensors.torch import load_file

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    report = tmp_path / "report.json"
    procs = [subprocess.Popen([sys.executable, "-m", "tests.fsdp_worker", str(r), "2", str(port),
                               str(tmp_path / "versions"), str(report)], env=env, cwd=root) for r in (0, 1)]
    try:
        codes = [p.wait(timeout=240) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert codes == [0, 0]
    done = json.loads(report.read_text())
    assert [c["step"] for c in done["commits"]] == [0, 1, 2] and done["errors"] == []
    full = load_file(str(tmp_path / "report.json.weights.safetensors"))
    got = Repo.open(tmp_path / "versions").load_state_dict(done["commits"][-1]["commit"])
    assert sorted(got) == sorted(full)
    assert all(torch.equal(got[k].view(torch.uint8), full[k].view(torch.uint8)) for k in full)


def test_a_follower_process_tracks_a_trainer_committing_every_step_exactly(tmp_path, hub_env):
    """Two processes: a real SFTTrainer (bf16) committing every step and pushing to the
    local Hub server; a follower process polling update(). As in an RL loop, the trainer
    waits at each step until the follower holds the previous one. Every version it reaches
    is bit-identical to that commit, and each update downloads at most 1.25x the stored
    bytes of the commits it moved over, plus 64 KB."""
    import os
    import queue
    import subprocess
    import sys
    from pathlib import Path

    from transformers import TrainerCallback

    from benchmarks.sync import digest

    url = f"hf://team/follow-{tmp_path.name}"
    stop = tmp_path / "stop"
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1", "WVC_CACHE": str(tmp_path / "cache")}
    follower = subprocess.Popen([sys.executable, "-m", "tests.follow_worker", url, "main", str(stop)],
                                stdout=subprocess.PIPE, text=True, env=env, cwd=root)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in follower.stdout], daemon=True).start()
    updates = []
    cb = every_step(tmp_path, push_to=url, branch="main", push_interval=0)

    class WaitForFollower(TrainerCallback):  # after WvcCallback has queued the last step
        def on_step_begin(self, args, state, control, **kwargs):
            assert cb.publisher.flush(timeout=60), cb.push_errors
            while not updates or updates[-1]["commit"] != cb.commits[-1]["commit"]:
                updates.append(json.loads(lines.get(timeout=60)))

    try:
        trl_helpers.sft_trainer(tmp_path / "out", [cb, WaitForFollower()], max_steps=6, save_steps=None, lr=1e-4,
                                dtype=torch.bfloat16).train()
        assert cb.push_errors == [] and not cb.unpushed
        stop.touch()
        follower.wait(timeout=120)
        while not lines.empty():
            updates.append(json.loads(lines.get()))
    finally:
        if follower.poll() is None:
            follower.kill()
    assert follower.returncode == 0
    repo = Repo.open(tmp_path / "versions")
    stored = {e.id: e.stored_bytes for e in repo.log("main")}
    order = [e.id for e in reversed(repo.log("main"))]
    assert [u["commit"] for u in updates] == order  # every step, in order, up to the tip
    for u in updates:
        assert u["digest"] == digest(repo.load_state_dict(u["commit"])), u
        assert u["downloaded_bytes"] <= 1.25 * stored[u["commit"]] + 64 * 1024, (updates.index(u), u, stored[u["commit"]])


def test_a_grpo_run_in_bf16_commits_every_step_as_small_loadable_deltas(tmp_path):
    """TRL's GRPOTrainer (the RL loop the live sync is for), bf16, lr 1e-5: every step is
    committed from memory, loads with from_pretrained exactly, and costs a small delta."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    def reward(completions, completion_ids, **kwargs):  # varies across a group: a real update
        return [float(sum(ids) % 7) for ids in completion_ids]

    cb = every_step(tmp_path)
    args = GRPOConfig(output_dir=str(tmp_path / "out"), max_steps=3, per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=6, report_to=[], use_cpu=True, learning_rate=1e-5, bf16=True,
                      logging_steps=1, save_strategy="no", disable_tqdm=True)
    prompts = Dataset.from_dict({"prompt": ["the cat sat on", "a dog ran", "big red mat", "small blue cat"] * 4})
    trainer = GRPOTrainer(model=trl_helpers.model(dtype=torch.bfloat16), reward_funcs=[reward], args=args,
                          train_dataset=prompts, processing_class=trl_helpers.tokenizer(), callbacks=[cb])
    trainer.train()
    assert [c["step"] for c in cb.commits] == [0, 1, 2, 3]
    assert all(0 < c["stored_bytes"] < cb.commits[0]["stored_bytes"] / 10 for c in cb.commits[1:])
    repo = Repo.open(tmp_path / "versions")
    out = tmp_path / "v3"
    repo.checkout(cb.commits[-1]["commit"], output=out)
    loaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.bfloat16).state_dict()
    live = trainer.model.state_dict()
    assert all(torch.equal(loaded[k].view(torch.int16), live[k].view(torch.int16)) for k in live)
