"""Storage cost: small fine-tune steps cost well under half; unchanged commits cost nothing."""

import torch
from safetensors.torch import save_file

from wvc.demo import adam_like_step, build_model


def save_bf16(master, root):
    save_file({k: v.to(torch.bfloat16) for k, v in master.items()}, str(root / "model.safetensors"))


def test_small_bf16_update_stores_well_under_half(repo):
    master = build_model(seed=3, vocab=1024, hidden=128, layers=2)
    save_bf16(master, repo.root)
    first = repo.commit("base")
    adam_like_step(master, seed=1)  # an optimizer step of lr 1e-4 on fp32 master weights
    save_bf16(master, repo.root)
    second = repo.commit("step 1")
    assert second.logical_bytes == first.logical_bytes
    assert second.stored_bytes < 0.4 * second.logical_bytes
    assert second.stored_bytes < 0.6 * first.stored_bytes  # the delta beats even a compressed full copy


def test_unchanged_recommit_stores_nothing(repo):
    save_bf16(build_model(seed=4, vocab=512, hidden=64, layers=1), repo.root)
    repo.commit("base")
    again = repo.commit("again", allow_empty=True)
    assert again.stored_bytes == 0
    assert again.new_objects == 0


def test_one_changed_tensor_costs_only_that_tensor(repo):
    master = build_model(seed=5, vocab=512, hidden=64, layers=2)
    save_bf16(master, repo.root)
    repo.commit("base")
    master["norm.weight"] += 0.5
    save_bf16(master, repo.root)
    res = repo.commit("norm only")
    norm_bytes = master["norm.weight"].numel() * 2
    header_allowance = 512  # the header chunk is unchanged; per-object container overhead only
    assert res.stored_bytes <= norm_bytes + header_allowance
