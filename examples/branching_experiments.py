"""Branch two learning-rate experiments off one base model and compare them.

    python examples/branching_experiments.py [--dir DIR]
"""

import argparse
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file

import wvc


def train_steps(weights: dict, lr: float, steps: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        for w in weights.values():
            w -= lr * torch.randn(w.shape, generator=g).clamp(-3, 3)


def save(weights: dict, root: Path) -> None:
    save_file({k: v.to(torch.bfloat16) for k, v in weights.items()}, str(root / "model.safetensors"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default=None)
    root = Path(ap.parse_args().dir or tempfile.mkdtemp(prefix="wvc-branches-"))
    g = torch.Generator().manual_seed(0)
    base = {f"layer{i}.weight": torch.randn(512, 512, generator=g) * 0.02 for i in range(4)}

    repo = wvc.Repo.init(root)
    save(base, root)
    repo.commit("base model")
    expected = {}  # branch -> the bytes of its last version, to check every checkout against
    for name, lr in (("lr-1e-4", 1e-4), ("lr-1e-3", 1e-3)):
        repo.create_branch(name, "main")
        repo.checkout(name)
        weights = {k: v.clone() for k, v in base.items()}
        for step in range(1, 4):
            train_steps(weights, lr, 1, seed=step)
            save(weights, root)
            res = repo.commit(f"{name} step {step}", metadata={"lr": lr, "step": step})
            expected[name] = (root / "model.safetensors").read_bytes()
            print(f"{name} step {step}: {res.stored_bytes / 1e3:.0f} KB stored of {res.logical_bytes / 1e6:.1f} MB")
    diff = repo.diff("lr-1e-4", "lr-1e-3")
    for t in diff["tensors"]:
        print(f"{t['name']}: {t['changed']}/{t['numel']} elements differ, max |delta| {t['max_abs_delta']:.2e}, "
              f"relative L2 {t['rel_l2']:.2e}")
    ok = True
    for name, data in expected.items():  # every branch checks out byte for byte
        repo.checkout(name)
        ok &= (root / "model.safetensors").read_bytes() == data
    repo.checkout("main")
    print("branches:", ", ".join(f"{b} {c[:12]}" for b, c in repo.branches().items()))
    print("every branch checks out byte-identical:", ok)
    if not ok or len(diff["tensors"]) != len(base):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
