"""A PEFT/LoRA adapter directory is a working tree like any other."""

import hashlib

import pytest
import torch

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

from wvc import Repo  # noqa: E402


def base_model():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=100, n_positions=32,
                                      bos_token_id=0, eos_token_id=0))


def test_adapter_versions_check_out_and_load_with_peft(tmp_path):
    from peft import LoraConfig, PeftModel, get_peft_model

    model = get_peft_model(base_model(), LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn"], init_lora_weights=False))
    adapter = tmp_path / "adapter"
    model.save_pretrained(adapter)
    repo = Repo.init(adapter)
    v1 = repo.commit("adapter after epoch 1").commit
    v1_bytes = (adapter / "adapter_model.safetensors").read_bytes()
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.01)
    model.save_pretrained(adapter)
    v2 = repo.commit("adapter after epoch 2")
    assert v2.stored_bytes < v2.logical_bytes  # a delta against the first adapter version

    repo.checkout(v1, output=tmp_path / "v1")
    out = tmp_path / "v1" / "adapter_model.safetensors"
    assert hashlib.sha256(out.read_bytes()).digest() == hashlib.sha256(v1_bytes).digest()
    loaded = PeftModel.from_pretrained(base_model(), tmp_path / "v1")
    from safetensors.torch import load_file

    saved = load_file(str(out))
    state = loaded.state_dict()
    for name, tensor in saved.items():
        live = next(v for k, v in state.items() if k.replace(".default", "") == name)
        assert torch.equal(live, tensor), name
