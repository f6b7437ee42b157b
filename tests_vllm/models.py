"""Tiny causal LMs for the vLLM tests: a Qwen2-shaped model from a transformers config,
random init, and a word-level tokenizer built in memory; each training step an AdamW-like
move of a few tensors (sign-of-gradient-ish updates of ~3% of their elements). Nothing is
downloaded."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

TOKENIZER_VOCAB = 320
WORDS = ("the a cat dog sat on mat ran fast slow big small red blue green under over near "
         "and or but if then when why how what who one two three four five six").split()


def save_tokenizer(root: Path) -> None:
    """A byte-level BPE trained here on a few sentences of WORDS (transformers reads a Qwen2
    model's tokenizer as byte-level BPE whatever tokenizer_config names, so it is one)."""
    import random

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    r = random.Random(0)
    text = [" ".join(r.choice(WORDS) for _ in range(12)) for _ in range(200)]
    tk = Tokenizer(models.BPE(unk_token=None))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.train_from_iterator(text, trainers.BpeTrainer(vocab_size=TOKENIZER_VOCAB, special_tokens=["<pad>", "<eos>"],
                                                     initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", eos_token="<eos>")
    fast.save_pretrained(str(root))


def config(tied: bool, dtype: str = "bfloat16", hidden: int = 128, layers: int = 2, vocab: int = 384):
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                       tie_word_embeddings=tied, bos_token_id=1, eos_token_id=1, pad_token_id=0,
                       torch_dtype=dtype, architectures=["Qwen2ForCausalLM"])


def build(root: Path, *, tied: bool, dtype=torch.bfloat16, seed: int = 0, **shape) -> dict:
    """A model directory (config, tokenizer, model.safetensors) at ``root``; its state dict."""
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = config(tied, str(dtype).removeprefix("torch."), **shape)
    model = Qwen2ForCausalLM(cfg).to(dtype)
    root.mkdir(parents=True, exist_ok=True)
    cfg.save_pretrained(str(root))
    save_tokenizer(root)
    sd = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    if tied:
        sd.pop("lm_head.weight", None)
    save(root, sd)
    return sd


def save(root: Path, sd: dict) -> None:
    save_file(sd, str(root / "model.safetensors"), metadata={"format": "pt"})


def step(sd: dict, names, *, seed: int, share: float = 0.03, scale: float = 0.02) -> None:
    """Move ``share`` of the elements of each tensor in ``names`` (in place), like one
    optimizer step of a fine-tune: most elements keep their bits."""
    g = torch.Generator().manual_seed(seed)
    for name in names:
        flat = sd[name].view(-1)
        n = max(1, int(flat.numel() * share))
        idx = torch.randperm(flat.numel(), generator=g)[:n]
        delta = (torch.randn(n, generator=g) * scale).to(flat.dtype)
        flat[idx] = flat[idx] + delta
