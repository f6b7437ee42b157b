"""What TRL 1.16's ``AsyncGRPOTrainer`` needs to train on a CPU, and the rewards its rollout
worker (a spawned process) imports by name.

On a machine without CUDA the trainer fails in two places, both outside its weight sync:

1. ``AsyncGRPOTrainer.__init__`` (async_grpo_trainer.py:1240) calls
   ``trl.trainer.utils.get_peak_flops_per_device``, which calls
   ``torch.cuda.get_device_name`` unconditionally (for its MFU metric): "Torch not compiled
   with CUDA enabled". Here it answers None, which TRL itself handles ("MFU metrics are
   disabled").
2. Every training forward runs TRL's tree attention (packing.py:187 ``tree_attention``),
   which calls ``flash_attn_varlen_func`` of the CUDA flash-attention 3 kernel fetched from
   the Hub by the ``kernels`` package (packing.py:161 ``_flash_attn``). Here the same
   function is computed with torch: each packed segment's queries attend causally (flash
   attention's bottom-right alignment) to that segment's gathered keys and values.

Everything else (rollouts from the real vLLM server, the GRPO loss, the optimizer, the
trainer's ``_sync_weight`` driving the weight transfer) runs as TRL ships it.
"""

from __future__ import annotations

import types


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None, max_seqlen_k=None,
                           softmax_scale=None, causal=True, window_size=(-1, -1), **_):
    import torch
    import torch.nn.functional as F

    if window_size != (-1, -1):
        raise NotImplementedError("sliding-window attention (the tiny test model has none)")
    heads, kv_heads = q.shape[1], k.shape[1]
    out = []
    for i in range(len(cu_seqlens_q) - 1):
        qs, qe = int(cu_seqlens_q[i]), int(cu_seqlens_q[i + 1])
        ks, ke = int(cu_seqlens_k[i]), int(cu_seqlens_k[i + 1])
        qi = q[qs:qe].transpose(0, 1)
        ki = k[ks:ke].transpose(0, 1).repeat_interleave(heads // kv_heads, 0)
        vi = v[ks:ke].transpose(0, 1).repeat_interleave(heads // kv_heads, 0)
        mask = torch.ones(qe - qs, ke - ks, dtype=torch.bool, device=q.device)
        mask = mask.tril(diagonal=(ke - ks) - (qe - qs)) if causal else mask
        out.append(F.scaled_dot_product_attention(qi, ki, vi, attn_mask=mask, scale=softmax_scale).transpose(0, 1))
    return torch.cat(out, 0)


def install() -> None:
    from trl.experimental.async_grpo import async_grpo_trainer, packing

    async_grpo_trainer.get_peak_flops_per_device = lambda accelerator, dtype: None
    packing._flash_attn = lambda: types.SimpleNamespace(flash_attn_varlen_func=flash_attn_varlen_func)


def _text(completion) -> str:
    if isinstance(completion, str):
        return completion
    return "".join(m.get("content") or "" for m in completion if isinstance(m, dict))


def letter_reward(completions, **_):
    """More of the letter a is better: varies across a group, so advantages are not zero."""
    return [float(_text(c).count("a")) - 0.1 * len(_text(c)) for c in completions]
