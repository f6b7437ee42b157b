"""Fine-tune a tiny GPT-2 (built from a config: nothing downloaded) and version every
checkpoint with WvcCallback; optionally push each one to a Hub remote in the background.

    python examples/finetune_with_callback.py [--dir DIR] [--push hf://user/repo]
"""

import argparse
import tempfile
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

import wvc
from wvc.integrations.transformers import WvcCallback


class RandomTokens(torch.utils.data.Dataset):
    def __init__(self, n=128, seq=32, vocab=256):
        g = torch.Generator().manual_seed(0)
        self.data = [torch.randint(0, vocab, (seq,), generator=g) for _ in range(n)]

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return {"input_ids": self.data[i], "labels": self.data[i]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default=None)
    ap.add_argument("--push", default=None, help="hf://user/repo or a directory")
    ap.add_argument("--steps", type=int, default=8)
    args = ap.parse_args()
    root = Path(args.dir or tempfile.mkdtemp(prefix="wvc-example-"))

    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=256, n_positions=64,
                                       bos_token_id=0, eos_token_id=0))
    callback = WvcCallback(root / "versions", push_to=args.push)  # one line to turn it on
    trainer = Trainer(
        model=model,
        args=TrainingArguments(output_dir=str(root / "checkpoints"), max_steps=args.steps, save_steps=2,
                               per_device_train_batch_size=8, learning_rate=5e-4, logging_steps=1,
                               report_to=[], use_cpu=True, disable_tqdm=True),
        train_dataset=RandomTokens(),
        callbacks=[callback],
    )
    trainer.train()

    repo = wvc.Repo.open(root / "versions")
    for entry in repo.log(callback.branch):
        m = entry.metadata
        print(f"{entry.id[:12]}  step {m['step']:>3}  loss {m['metrics'].get('loss', float('nan')):.4f}  "
              f"stored {entry.stored_bytes / 1e3:7.1f} KB")
    first = callback.commits[0]
    print(f"{len(callback.commits)} checkpoints of {first['logical_bytes'] / 1e6:.1f} MB each, "
          f"{sum(c['stored_bytes'] for c in callback.commits) / 1e6:.2f} MB stored in all; "
          f"mean commit {sum(c['seconds'] for c in callback.commits) / len(callback.commits):.2f} s")
    if callback.push_errors:
        print("push errors:", *callback.push_errors, sep="\n  ")
    # every saved checkpoint's weights come back byte for byte from its commit
    ok = len(callback.commits) == args.steps // 2
    for c in callback.commits:
        saved = root / "checkpoints" / f"checkpoint-{c['step']}" / "model.safetensors"
        out = root / "restored" / str(c["step"])
        repo.checkout(c["commit"], output=out)
        ok &= (out / "model.safetensors").read_bytes() == saved.read_bytes()
    print("every checkpoint restores byte-identical:", ok)
    if not ok or callback.push_errors:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
