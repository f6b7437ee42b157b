"""Merge methods for a tensor that both sides of a merge changed (docs/merge.md).

Each method takes the merge-base's tensor and the two sides' (``ours``, ``theirs``) and
returns the merged tensor in their dtype. Arithmetic is in float32 (float64 stays float64)
and the result is rounded once to the tensor's dtype (round to nearest even). The
definitions, and the order of operations, follow mergekit's (``linear``, ``task_arithmetic``,
``ties``, ``dare_linear``, ``dare_ties``, ``slerp``) so that results agree bit for bit;
tests/test_merge_methods.py checks that against mergekit itself.

torch is imported by the functions, not by this module.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from ..errors import InvalidArgument

TAKE_SIDE = ("ours", "theirs")
COMPUTED = ("linear", "task-arithmetic", "ties", "dare-linear", "dare-ties", "slerp")
STRATEGIES = TAKE_SIDE + COMPUTED


@dataclass(frozen=True)
class MergeParameters:
    weight_ours: float = 0.5
    weight_theirs: float = 0.5
    density: float = 1.0  # ties / dare: the share of each task vector kept
    lam: float = 1.0  # task-arithmetic / ties / dare: scale of the merged task vector
    seed: int = 0  # dare: the random drop
    t: float = 0.5  # slerp: 0 is ours, 1 is theirs

    def check(self, strategy: str) -> "MergeParameters":
        if strategy not in STRATEGIES:
            raise InvalidArgument(f"unknown merge strategy {strategy!r}: use one of {', '.join(STRATEGIES)}")
        if not 0 < self.density <= 1:
            raise InvalidArgument(f"--density must be in (0, 1], not {self.density}")
        if not 0 <= self.t <= 1:
            raise InvalidArgument(f"--t must be in [0, 1], not {self.t}")
        if strategy == "linear" and self.weight_ours + self.weight_theirs == 0:
            raise InvalidArgument("linear merge weights must not add up to 0")
        return self

    def to_json(self, strategy: str) -> dict:
        used = {"linear": ("weight_ours", "weight_theirs"),
                "task-arithmetic": ("weight_ours", "weight_theirs", "lam"),
                "ties": ("weight_ours", "weight_theirs", "density", "lam"),
                "dare-linear": ("weight_ours", "weight_theirs", "density", "lam", "seed"),
                "dare-ties": ("weight_ours", "weight_theirs", "density", "lam", "seed"),
                "slerp": ("t",)}.get(strategy, ())
        return {k: getattr(self, k) for k in used}


def tensor_seed(seed: int, name: str) -> int:
    """The seed of one tensor's random drop: the user's seed and the tensor's name, so a
    tensor's result does not depend on which other tensors were merged."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:7], "little")


def merge_tensor(strategy: str, base, ours, theirs, params: MergeParameters, name: str = ""):
    """The merged tensor (dtype of ``ours``). ``base`` may be None only for slerp and linear."""
    import torch

    if strategy == "ours":
        return ours
    if strategy == "theirs":
        return theirs
    out_dtype = ours.dtype
    work = torch.float64 if out_dtype == torch.float64 else torch.float32
    o, t = ours.to(work), theirs.to(work)
    if strategy == "linear":
        result = torch.zeros_like(o)
        weights = torch.tensor([params.weight_ours, params.weight_theirs], dtype=work)
        for x, w in zip((o, t), weights.unbind(0)):
            result.addcmul_(x, w)
        return result.div_(weights.sum()).to(out_dtype)
    if strategy == "slerp":
        return _slerp(params.t, o, t).to(out_dtype)
    return _task_vectors(strategy, base.to(work), o, t, params, name).to(out_dtype)


_SPARSIFY = {"task-arithmetic": None, "ties": "magnitude", "dare-linear": "random", "dare-ties": "random"}
_CONSENSUS = {"ties", "dare-ties"}
_NORMALIZE = {"ties"}  # mergekit's defaults: normalize for ties only
_RESCALE = {"dare-linear", "dare-ties"}


def _task_vectors(strategy, base, o, t, params: MergeParameters, name: str):
    import torch

    generator = torch.Generator().manual_seed(tensor_seed(params.seed, name)) if strategy.startswith("dare") else None
    deltas = base.new_empty((2, *base.shape))
    for i, side in enumerate((o, t)):
        delta = side - base
        if _SPARSIFY[strategy] == "magnitude":
            delta = _magnitude(delta, params.density)
        elif _SPARSIFY[strategy] == "random":
            delta = _bernoulli(delta, params.density, generator)
        deltas[i] = delta
    weights = torch.tensor([params.weight_ours, params.weight_theirs], dtype=deltas.dtype)
    while deltas.dim() > weights.dim():
        weights.unsqueeze_(-1)
    deltas.mul_(weights)
    if strategy in _CONSENSUS:
        sign = deltas.sign()
        majority = (deltas.sum(dim=0) >= 0).to(deltas.dtype) * 2 - 1
        mask = sign == majority
        mixed = (deltas * mask).sum(dim=0)
        divisor = (weights * mask).sum(dim=0)
        divisor[divisor == 0] = 1
    else:
        mixed = deltas.sum(dim=0)
        divisor = weights.sum(dim=0)
        divisor[divisor.abs() < 1e-8] = 1
    if strategy in _NORMALIZE:
        mixed /= divisor
    if params.lam != 1:
        mixed *= params.lam
    return base + mixed


def _magnitude(delta, density: float):
    """Keep the ``density`` share of elements largest in magnitude (at least one)."""
    import torch

    if density >= 1:
        return delta
    k = max(1, int(density * delta.numel()))
    mask = torch.zeros(delta.numel(), dtype=delta.dtype)
    keep = torch.argsort(delta.abs().reshape(-1).float(), descending=True)[:k]
    mask[keep] = 1
    return delta * mask.reshape_as(delta)


def _bernoulli(delta, density: float, generator):
    """DARE: drop each element with probability 1 - density, rescale to the same L1 norm."""
    import torch

    if density >= 1:
        return delta
    mask = torch.bernoulli(torch.full_like(delta, density, dtype=torch.float32), generator=generator)
    masked = delta.to(torch.float32) * mask
    before, after = delta.to(torch.float32).abs().sum(), masked.abs().sum()
    if before < 1e-7 or after < 1e-7:
        return masked.to(delta.dtype)
    return (masked * (before / after)).to(delta.dtype)


SLERP_CHUNK_ELEMENTS = 1 << 20  # mergekit's: sums over chunks of this size, so the rounding agrees


def _slerp(t: float, a, b, dot_threshold: float = 0.9995, eps: float = 1e-8):
    """Spherical interpolation of the flattened tensors (linear where they are collinear)."""
    import torch

    x, y = a.reshape(1, -1), b.reshape(1, -1)
    tt = torch.tensor([[t]], dtype=x.dtype)
    if not x.shape[1]:
        return ((1 - tt) * x + tt * y).reshape(a.shape)
    spans = [(i, i + SLERP_CHUNK_ELEMENTS) for i in range(0, x.shape[1], SLERP_CHUNK_ELEMENTS)]
    norm_x = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(x[:, i:j], dim=1, keepdim=True)
                                                   for i, j in spans]), dim=0)
    norm_y = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(y[:, i:j], dim=1, keepdim=True)
                                                   for i, j in spans]), dim=0)
    norm_x = torch.where(norm_x > eps, norm_x, 1)
    norm_y = torch.where(norm_y > eps, norm_y, 1)
    dot = torch.stack([((x[:, i:j] / norm_x) * (y[:, i:j] / norm_y)).sum(dim=1, keepdim=True)
                       for i, j in spans]).sum(dim=0).clamp(-1, 1)
    linear = dot.abs() > dot_threshold
    theta = torch.acos(torch.where(linear, 0, dot))
    sin_theta = torch.sin(theta)
    coef_x = torch.where(linear, 1 - tt, torch.sin((1 - tt) * theta) / sin_theta)
    coef_y = torch.where(linear, tt, torch.sin(tt * theta) / sin_theta)
    return (coef_x * x + coef_y * y).reshape(a.shape)
