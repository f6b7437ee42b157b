"""A server started mid-run from a clone's checkout (its --model the clone's working tree)
reads one step at its first update, not the model (issue 65): the step's record is coded in
the context of the version before the one it started from, which the clone holds
(read/lent_chunks.py). Its outputs then equal a fresh engine's on the same commit."""

import torch

import wvc
from wvc.integrations.vllm import attach
from wvc.read import follower as follower_module

from . import engine
from .conftest import Trainer


def adam_like(trainer: Trainer, active: dict, way: dict) -> str:
    """One step that moves the same elements of every tensor by a unit in the last place, the
    same way (Adam's moments at a small learning rate): the steps are step payloads, each coded
    in the context of the step before (codec/step_coder.py)."""
    for name, t in trainer.sd.items():
        t.view(torch.int16).view(-1)[active[name]] += way[name]
    return trainer.commit(f"adam-like step {trainer.seed}")


def test_a_server_started_mid_run_from_a_clone_reads_one_step(tmp_path, monkeypatch):
    trainer = Trainer(tmp_path / "run", tied=True, dtype=torch.bfloat16)
    g = torch.Generator().manual_seed(5)
    # (nonzero elements only: a unit off a zero's bits is a NaN)
    active = {n: (lambda nz: nz[torch.randperm(nz.numel(), generator=g)[: max(1, t.numel() // 40)]])(
        torch.nonzero(t.reshape(-1) != 0).reshape(-1)) for n, t in trainer.sd.items()}
    way = {n: (torch.randint(0, 2, (a.numel(),), generator=g, dtype=torch.int16) * 2 - 1) for n, a in active.items()}
    commits = [adam_like(trainer, active, way) for _ in range(3)]
    monkeypatch.setenv("WVC_CACHE", str(tmp_path / "along"))  # (its kept keyframes are its own)
    along = wvc.follow(trainer.remote)
    along.update(commits[1])
    step_bytes = along.update(commits[2]).downloaded_bytes

    clone = wvc.clone(trainer.remote, tmp_path / "clone")
    clone.checkout(commits[1], force=True)
    monkeypatch.setenv("WVC_CACHE", str(tmp_path / "server"))
    llm = engine.start(tmp_path / "clone")
    attached = attach(llm, trainer.remote, "main", at=commits[1])  # (at='s tree read here)

    def no_ordinary_read(*args, **kwargs):
        raise AssertionError("the server read a version the ordinary way: no usable record")

    monkeypatch.setattr(follower_module, "open_remote_version", no_ordinary_read)  # (the engine is in-process)
    up = attached.update(commits[2])
    assert up is not None and up.commit == commits[2] == attached.commit
    assert up.downloaded_bytes <= 1.25 * step_bytes + 4096, (up.downloaded_bytes, step_bytes)
    assert up.downloaded_bytes < 0.2 * trainer.model_bytes()
    got = engine.probe(llm)
    assert got == engine.fresh_probe(trainer.checkout(commits[2]))  # (a NaN anywhere would differ)
