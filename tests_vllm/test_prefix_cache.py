"""An engine following through the wvc backend without ``commit`` at init, and the worker
extension. Every path that changes an engine's weights through wvc leaves no cached KV computed with
the old weights (issue 64 finding 6): the worker extension's ``collective_rpc("wvc_update")``
and the weight-transfer backend's ``update_weights`` reset the prefix cache themselves. A
prompt longer than a cache block, asked before and after an update, must get what it gets
after a reset by hand (prompt logprobs are left out: they bypass the prefix cache)."""

import pytest
import torch

from . import engine
from .conftest import Trainer

LONG = " ".join(["the cat sat on the mat and the dog ran near the green tree"] * 3)  # ~78 tokens: 2 blocks of 32


def long_probe(llm) -> list:
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=4, logprobs=5, seed=0)
    out = llm.generate([LONG, LONG + " again"], params, use_tqdm=False)
    return [[list(c.token_ids), [engine._top(lp) for lp in c.logprobs]] for c in (r.outputs[0] for r in out)]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    trainer = Trainer(tmp_path_factory.mktemp("prefix"), tied=False, dtype=torch.bfloat16)
    mp = pytest.MonkeyPatch()
    mp.setenv("WVC_VLLM_REMOTE", trainer.remote)  # (the backend's remote: whoever starts the engine sets it)
    llm = engine.start(trainer.checkout(trainer.first), block_size=32,
                       worker_extension_cls="wvc.integrations.vllm.WorkerExtension",
                       weight_transfer_config={"backend": "wvc"})
    yield trainer, llm
    mp.undo()


def _cached_then_fresh(llm, update) -> tuple[list, list, list]:
    before = long_probe(llm)
    long_probe(llm)  # (its blocks now cached)
    update()
    after = long_probe(llm)
    llm.reset_prefix_cache()
    return before, after, long_probe(llm)


def test_the_worker_extensions_update_leaves_no_cached_kv_of_the_old_weights(run):
    trainer, llm = run
    llm.collective_rpc("wvc_attach", kwargs={"source": trainer.remote, "at": trainer.first})
    commit = trainer.step(["model.layers.0.self_attn.v_proj.weight", "model.layers.1.mlp.down_proj.weight"])
    before, after, fresh = _cached_then_fresh(llm, lambda: llm.collective_rpc("wvc_update"))
    assert fresh != before, "the step did not change the outputs: the test would not see stale blocks"
    assert after == fresh, "the first answer after the update reused blocks computed with the old weights"
    assert [i["commit"] for i in llm.collective_rpc("wvc_info")] == [commit]


def test_the_backends_update_leaves_no_cached_kv_of_the_old_weights(run):
    trainer, llm = run
    llm.init_weight_transfer_engine({"init_info": {}})
    first = trainer.step(["model.layers.1.self_attn.q_proj.weight"])
    llm.start_weight_update()
    llm.update_weights({"update_info": {"commit": first}})  # (no commit at init: the whole version)
    llm.finish_weight_update()
    commit = trainer.step(["model.layers.0.mlp.up_proj.weight", "model.layers.1.self_attn.o_proj.weight"])

    def update():
        llm.start_weight_update()
        llm.update_weights({"update_info": {"commit": commit}})
        llm.finish_weight_update()

    before, after, fresh = _cached_then_fresh(llm, update)
    assert fresh != before, "the step did not change the outputs: the test would not see stale blocks"
    assert after == fresh, "the first answer after the update reused blocks computed with the old weights"


@pytest.mark.parametrize("change", ["a tensor missing", "a shape changed", "a 3 KB tensor added"])
def test_a_version_a_fresh_engine_would_refuse_is_refused_before_anything_is_written(run, change):
    """Issue 64 findings 7 and 8: without ``commit`` at init a version lacking a tensor or
    with a tensor's declared shape changed was reported loaded (the missing tensor kept its
    old values), and one with a 3 KB tensor added made the engine allocate the whole model
    before failing. Refused before anything is fetched, allocated or written."""
    trainer, llm = run
    held = llm.collective_rpc("wvc_loaded_commit")
    before = long_probe(llm)
    sd = dict(trainer.sd)
    name = "model.layers.1.mlp.down_proj.weight"
    if change == "a tensor missing":
        del sd[name]
    elif change == "a shape changed":
        sd[name] = sd[name].reshape(sd[name].shape[1], sd[name].shape[0]).contiguous()
    else:
        sd["model.extra.weight"] = torch.zeros(1536, dtype=torch.bfloat16)
    bad = trainer.commit_other(sd, change)
    llm.start_weight_update()
    with pytest.raises(Exception, match="does not fit the engine's model"):
        llm.update_weights({"update_info": {"commit": bad}})
    assert llm.collective_rpc("wvc_loaded_commit") == held
    assert long_probe(llm) == before


def test_an_offline_engine_refuses_a_label_that_is_not_the_commit_it_holds(run):
    """Issue 64 finding 10: the server refused ``weight_version="step-42"``, the offline
    engine accepted and reported it."""
    trainer, llm = run
    held = llm.collective_rpc("wvc_loaded_commit")[0]
    llm.start_weight_update()
    with pytest.raises(ValueError, match="refused"):
        llm.finish_weight_update("step-42")
    with pytest.raises(ValueError, match="refused"):
        llm.update_weight_version("step-42")
    assert llm.get_weight_version() == held


def test_an_update_before_init_is_a_runtime_error_as_vllms_own_backends_raise(tmp_path, monkeypatch):
    from wvc.integrations.vllm.transfer import WvcWeightTransferEngine

    engine = WvcWeightTransferEngine.__new__(WvcWeightTransferEngine)
    with pytest.raises(RuntimeError, match="not initialized"):
        engine.start_weight_update()
