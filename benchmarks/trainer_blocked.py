"""What a sync costs the trainer: its blocked time a sync against ``save_file`` of the same
checkpoint (issue 65).

    VENV=$(bash .ci/vllm-env)
    VENV/bin/python -m benchmarks.trainer_blocked [--models 75m] [--steps 20] [--blocking]
                                                  [--out benchmarks/results/trainer_blocked.json]

Runs in the vLLM environment: a real vLLM server (``wvc`` backend, CPU) follows a directory
remote. The trainer is driven as TRL's AsyncGRPOTrainer drives its transfer
(``_sync_weight_merged``: ``pause()``, ``send_weights(self._streaming_iter())``,
``resume()``, then the model version bumped and told to the rollout worker), with an fp32
master moved by AdamW-like steps at lr 1e-6 between syncs (benchmarks/trl_sync.py's
models). Per sync: the trainer's blocked time (pause + send_weights + resume); from the
sync's record, the seconds from send to every server holding it (``done_s``). In the same
run, ``save_file`` of the same bf16 checkpoint to a local directory, each step (the yardstick:
what a trainer that writes a checkpoint for its servers is blocked for at least).

At the end (``wait()``): the server reports the last commit, the remote's last version equals
the trainer's last bf16 weights, and the rollout worker's version is the last one sent; the
benchmark fails otherwise. ``--blocking`` runs the blocking sync (``background=False``) for
the before/after comparison.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from .sync import _median
from .vllm_sync import MODELS, build

RESULTS = Path(__file__).parent / "results"


class _RolloutWorker:
    def __init__(self):
        self.model_version = 0
        self.told = []

    def update_model_version(self, version):
        self.model_version = version
        self.told.append(version)


class _Trainer:
    """The parts of AsyncGRPOTrainer its transfer reads: ``model_version``, ``state.global_step``,
    ``rollout_worker``, and the ``_streaming_iter`` generator."""

    def __init__(self, master: dict, transfer):
        self.master, self.weight_transfer = master, transfer
        self.model_version, self.rollout_worker = 0, _RolloutWorker()
        self.state = type("State", (), {"global_step": 0})()
        transfer.bind_trainer(self)  # (what wvc's hook on AsyncGRPOTrainer.__init__ does)

    def _streaming_iter(self):
        yield from self.master.items()

    def sync_weight(self) -> float:
        t0 = time.perf_counter()
        self.weight_transfer.pause()
        self.weight_transfer.send_weights(self._streaming_iter())
        self.weight_transfer.resume()
        blocked = time.perf_counter() - t0
        self.model_version += 1
        self.rollout_worker.update_model_version(self.model_version)
        return blocked


def run_model(name: str, spec: dict, steps: int, work: Path, lr: float, background: bool) -> dict:
    import torch
    from safetensors.torch import save_file

    import wvc
    from wvc.integrations.trl import WvcWeightTransfer

    from tests_vllm.engine import server

    from .cases import adam_step

    root = work / name
    start = root / "start"
    master = build(start, spec)
    save_file({k: v.to(torch.bfloat16) for k, v in master.items()}, str(start / "model.safetensors"),
              metadata={"format": "pt"})
    params = sum(t.numel() for t in master.values())
    print(f"{name}: {params / 1e6:.1f}M parameters, background={background}", flush=True)
    remote = root / "remote"
    with server(start, root / "server.log", wvc_backend=True, remote=remote) as url:
        transfer = WvcWeightTransfer(str(remote), servers=[url], repo=root / "staging", start=start,
                                     background=background)
        transfer.init_weight_transfer()
        trainer = _Trainer(master, transfer)
        g = torch.Generator().manual_seed(1)
        rows = []
        for step in range(1, steps + 1):
            t0 = time.perf_counter()
            adam_step(master, g, lr)  # the trainer's work between syncs
            train_s = time.perf_counter() - t0
            trainer.state.global_step = step
            blocked = trainer.sync_weight()
            t0 = time.perf_counter()
            save_file({k: v.to(torch.bfloat16) for k, v in master.items()}, str(root / "checkpoint.safetensors"),
                      metadata={"format": "pt"})
            save_s = time.perf_counter() - t0
            rows.append({"step": step, "blocked_s": blocked, "save_file_s": save_s, "train_s": train_s})
            print(f"  sync {step}: blocked {blocked:.3f} s, save_file {save_s:.3f} s", flush=True)
        t0 = time.perf_counter()
        transfer.wait()
        drain_s = time.perf_counter() - t0
        last = transfer.syncs[-1]
        held = transfer.servers[0].weight_version()
        if held != last["commit"] or last["model_version"] != steps:
            raise SystemExit(f"{name}: the server holds {held}, the last sync is {last}")
        if trainer.rollout_worker.model_version != steps:
            raise SystemExit(f"{name}: the rollout worker says {trainer.rollout_worker.model_version}")
        got = wvc.open(str(remote), last["commit"]).state_dict()
        if not all(torch.equal(got[k].view(torch.int16), v.to(torch.bfloat16).view(torch.int16))
                   for k, v in master.items()):
            raise SystemExit(f"{name}: the last version differs from the trainer's weights")
        syncs = [{k: s.get(k) for k in ("model_version", "commit_s", "push_s", "queued_s", "done_s", "snapshot_s")}
                 for s in transfer.syncs]
        superseded = transfer.superseded
        transfer.destroy()
    return {"model": name, "parameters": params, "background": background, "steps": rows, "syncs": syncs,
            "superseded": superseded, "drain_s": drain_s}


def table(results: list[dict]) -> str:
    lines = ["| model | mode | blocked s / sync (median; max) | save_file s (median) | blocked / save_file (median; "
             "max / median save_file) | slowest / median blocked | send -> server holds it s (median) | "
             "published / sent |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        blocked = [s["blocked_s"] for s in r["steps"][1:]]  # (sync 1 reads the checkpoint's dtypes once)
        save = _median([s["save_file_s"] for s in r["steps"]])
        done = [s["done_s"] for s in r["syncs"] if s.get("done_s") is not None]
        held = f"{_median(done):.2f}" if done else "(inside blocked)"
        lines.append(f"| {r['model']} | {'background' if r['background'] else 'blocking'} | "
                     f"{_median(blocked):.3f}; {max(blocked):.3f} | {save:.3f} | {_median(blocked) / save:.2f}x; "
                     f"{max(blocked) / save:.2f}x | {max(blocked) / _median(blocked):.2f}x | {held} | "
                     f"{len(r['syncs'])} / {len(r['steps'])} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--models", nargs="+", default=["75m"], choices=sorted(MODELS))
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--lr", type=float, default=1e-6)
    p.add_argument("--blocking", action="store_true", help="also run background=False, first")
    p.add_argument("--out", type=Path, default=RESULTS / "trainer_blocked.json")
    args = p.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            for background in ([False, True] if args.blocking else [True]):
                results.append(run_model(name, MODELS[name], args.steps, Path(tmp) / f"{name}-{background}",
                                         args.lr, background))
    args.out.write_text(json.dumps(results, indent=1))
    text = table(results)
    args.out.with_suffix(".md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
