"""The plain-parameter layout (what GPUs use; here the CPU backend's packing turned off):
an untied fp32 model follows a branch by sparse patches of the changed elements through
vLLM's checkpoint patch loader, exactly."""

import pytest
import torch

from wvc.integrations.vllm import attach

from . import engine
from .conftest import Trainer


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    trainer = Trainer(tmp_path_factory.mktemp("plain"), tied=False, dtype=torch.float32)
    llm = engine.start(trainer.checkout(trainer.first), packing=False,
                       worker_extension_cls="wvc.integrations.vllm.WorkerExtension")
    return trainer, llm, attach(llm, trainer.remote, "main", at=trainer.first), engine.probe(llm)


def test_untied_steps_go_as_patches_of_the_kind_that_cost_less_and_equal_a_fresh_engine(run):
    """The first step goes as sparse patches (only the changed elements), the second as dense
    ones (both kinds then measured in this engine), the third as whichever cost less per
    element: each exact."""
    trainer, llm, attached, before = run
    kinds = []
    for names in (["model.layers.0.self_attn.k_proj.weight", "lm_head.weight", "model.embed_tokens.weight"],
                  ["model.layers.1.mlp.gate_proj.weight", "model.layers.1.post_attention_layernorm.weight"],
                  ["model.layers.0.mlp.up_proj.weight", "model.layers.1.self_attn.v_proj.weight"]):
        commit = trainer.step(names)
        measured = llm.collective_rpc(_costs)[0]  # (what the choice is made on)
        up = attached.update()
        assert up.commit == commit and up.changed == sorted(names)
        assert up.applied["reloaded"] == []
        sparse, dense = up.applied["sparse"], up.applied["dense"]
        assert sorted([*sparse, *dense]) == sorted(names) and not (sparse and dense)
        kinds.append("sparse" if sparse else "dense")
        for name in sparse:  # only the changed elements went in: ~3% of each tensor
            assert 0 < sparse[name] <= 0.04 * trainer.sd[name].numel()
        got = engine.probe(llm)
        assert got == engine.fresh_probe(trainer.checkout(commit), packing=False)
        assert got != before
        before = got
    assert kinds[:2] == ["sparse", "dense"]
    assert kinds[2] == min(measured, key=measured.get), (kinds, measured)


def _costs(worker) -> dict:
    from wvc.integrations.vllm import offline

    session = offline._SESSIONS[offline._worker_of(worker)]
    return {} if session._weights is None else dict(session._weights.costs.per_element)


def test_the_worker_extension_drives_the_same_follower_by_method_name(run):
    """``LLM(worker_extension_cls=...)`` users call the workers' methods by name."""
    trainer, llm, attached, _ = run
    held = attached.commit
    assert [i["commit"] for i in llm.collective_rpc("wvc_info")] == [held]
    commit = trainer.step(["model.layers.0.mlp.down_proj.weight"])
    (moved,) = llm.collective_rpc("wvc_update")
    assert moved["commit"] == commit and moved["parent"] == held and moved["changed"] == [
        "model.layers.0.mlp.down_proj.weight"]
    assert llm.collective_rpc("wvc_update", kwargs={"timeout": 0}) == [None]
    llm.reset_prefix_cache()
    assert engine.probe(llm) == engine.fresh_probe(trainer.checkout(commit), packing=False)


def test_a_tensor_larger_than_the_sparse_staging_bound_goes_dense(run):
    """vLLM's sparse patch loader stages each patched tensor whole (NaN where unchanged, on the
    host), so a sparse patch of a large tensor costs ~1.5x its bytes in transient memory (the
    first 494M update peaked the engine 390 MB over later ones, issue 65): a tensor larger than
    SPARSE_STAGING_BYTES goes dense even while sparse is the kind chosen (the costs
    unmeasured), the smaller one beside it sparse; exact."""
    from wvc.integrations.vllm import engine_weights

    trainer, llm, attached, _ = run
    big, small = "model.embed_tokens.weight", "model.layers.1.post_attention_layernorm.weight"
    bound = trainer.sd[big].numel() * trainer.sd[big].element_size() - 1
    assert trainer.sd[small].numel() * trainer.sd[small].element_size() <= bound
    llm.collective_rpc(_staging_bound, args=(bound,))
    try:
        commit = trainer.step([big, small])
        up = attached.update()
        assert up.commit == commit
        assert up.applied["dense"] == [big] and list(up.applied["sparse"]) == [small]
        assert engine.probe(llm) == engine.fresh_probe(trainer.checkout(commit), packing=False)
    finally:
        llm.collective_rpc(_staging_bound, args=(engine_weights.SPARSE_STAGING_BYTES,))


def _staging_bound(worker, bound: int) -> None:
    """Set the worker's sparse staging bound, and forget what each kind of patch cost (so the
    next patch of few changed elements is chosen sparse)."""
    from wvc.integrations.vllm import engine_weights, offline

    engine_weights.SPARSE_STAGING_BYTES = bound
    session = offline._SESSIONS[offline._worker_of(worker)]
    if session._weights is not None:
        session._weights.costs = engine_weights._Costs()
