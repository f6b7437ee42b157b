"""An in-process vLLM engine on the CPU backend's packed weights (tied embeddings, bf16)
follows a branch: after each update its greedy tokens, top-5 logprobs and prompt logprobs
equal those of a fresh engine started from `wvc checkout` of the same commit."""

import pytest
import torch

from wvc.errors import EngineUnusable, WvcError
from wvc.integrations.vllm import attach, engine_weights

from . import engine
from .conftest import Trainer

Q0 = "model.layers.0.self_attn.q_proj.weight"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    trainer = Trainer(tmp_path_factory.mktemp("packed"), tied=True, dtype=torch.bfloat16)
    llm = engine.start(trainer.checkout(trainer.first))
    attached = attach(llm, trainer.remote, "main", at=trainer.first)
    return trainer, llm, attached, {"probe": engine.probe(llm)}


def _packed(worker) -> bool:
    model = worker.model_runner.get_model()
    return any(hasattr(m, "cpu_linear") and getattr(m, "weight", None) is not None and m.weight.numel() == 0
               for m in model.modules())


def _one_packed_copy_for_tied_weights(worker) -> bool:
    model = worker.model_runner.get_model()
    return model.lm_head.weight is model.model.embed_tokens.weight and \
        model.lm_head.cpu_linear is model.model.embed_tokens.cpu_linear


def needs_packed_weights(llm) -> None:
    """The packed layout exists only where vLLM's oneDNN path packs (a CPU with AVX-512): on
    an AVX2-only CPU vLLM keeps plain weights, and what these tests assert of packing cannot
    happen (test_plain_engine.py covers that layout)."""
    if not all(llm.collective_rpc(_packed)):
        pytest.skip("vLLM keeps plain weights on this CPU (no AVX-512): no packed layout to test")


def _moves_to(run, commit, names=None):
    trainer, llm, attached, last = run
    up = attached.update()
    assert up is not None and up.commit == commit and attached.commit == commit
    got = engine.probe(llm)
    want = engine.fresh_probe(trainer.checkout(commit))
    assert got == want, "the updated engine's outputs differ from a fresh engine's on the same commit"
    assert got != last["probe"], "the step did not change the outputs: the test would not see a stale weight"
    assert llm.llm_engine.get_weight_version() == commit
    last["probe"] = got
    return up


def test_a_step_leaving_part_of_a_fused_module_equals_a_fresh_engine(run):
    """q changes, k and v do not (one qkv_proj), the tied embedding and a norm change: the
    whole qkv set is reloaded, the embedding patched and the LM head's packed copy rebuilt."""
    trainer = run[0]
    needs_packed_weights(run[1])
    commit = trainer.step([Q0, "model.embed_tokens.weight", "model.norm.weight"])
    up = _moves_to(run, commit)
    assert up.changed == sorted([Q0, "model.embed_tokens.weight", "model.norm.weight"])
    applied = up.applied
    assert set(applied["reloaded"]) == {f"model.layers.0.self_attn.{p}_proj.{w}" for p in "qkv" for w in ("weight", "bias")}
    assert "lm_head" in applied["repacked"]
    # its packed copy built from the new values before the write (on a server: while it
    # serves), which only put it in place; one copy for the LM head and the embedding module
    # it is tied to (vLLM packs the tied weight for each)
    assert set(applied["prepared"]) == set(applied["repacked"])
    assert all(run[1].collective_rpc(_one_packed_copy_for_tied_weights))
    # the engine started at=the first commit: it downloaded the step, not the model
    assert 0 < up.downloaded_bytes < 0.15 * trainer.model_bytes(), (up.downloaded_bytes, trainer.model_bytes())


def test_three_consecutive_steps_each_equal_a_fresh_engine(run):
    trainer = run[0]
    plans = [["model.layers.1.mlp.up_proj.weight", "model.layers.0.input_layernorm.weight"],
             ["model.layers.0.self_attn.o_proj.weight", "model.embed_tokens.weight"],
             ["model.layers.1.self_attn.v_proj.weight", "model.layers.1.mlp.down_proj.weight"]]
    for names in plans:
        up = _moves_to(run, trainer.step(names))
        assert up.changed == sorted(names)


def test_when_nothing_could_be_prepared_the_write_repacks_and_equals_a_fresh_engine(run, monkeypatch):
    """EngineWeights.prepare is an optimisation: when it fails (or declines), the write
    rebuilds the LM head's packed copy itself, and the engine is exact all the same."""
    trainer = run[0]
    needs_packed_weights(run[1])

    def failing(self, host, changed):
        raise RuntimeError("no packing before the write")

    monkeypatch.setattr(engine_weights.EngineWeights, "prepare", failing)
    up = _moves_to(run, trainer.step(["model.embed_tokens.weight", "model.layers.1.mlp.up_proj.weight"]))
    assert "lm_head" in up.applied["repacked"] and up.applied["prepared"] == []


def test_an_update_with_nothing_new_changes_nothing(run):
    trainer, llm, attached, last = run
    assert attached.update() is None and attached.update(timeout=0) is None
    assert engine.probe(llm) == last["probe"]


def test_a_remote_object_deleted_mid_update_leaves_the_engine_on_the_old_version(run, monkeypatch, tmp_path):
    trainer, llm, attached, last = run
    held = attached.commit
    pushed = trainer.step(["model.layers.0.mlp.gate_proj.weight"])
    from wvc.remotes import step_records

    real_fetch = step_records.fetch
    aside = tmp_path / "packs-aside"
    aside.mkdir()

    def fetch_then_lose_the_packs(backend, commit):
        record = real_fetch(backend, commit)
        for pack in (trainer.root / "remote").rglob("*.pack"):  # the step's payloads go away meanwhile
            pack.rename(aside / pack.name)
        return record

    monkeypatch.setattr(step_records, "fetch", fetch_then_lose_the_packs)
    try:
        with pytest.raises(WvcError):
            attached.update()
    finally:
        for pack in aside.iterdir():  # back, for the next test
            pack.rename(next((trainer.root / "remote").rglob("packs")) / pack.name)
    assert attached.commit == held and llm.llm_engine.get_weight_version() == held
    assert engine.probe(llm) == last["probe"], "a failed fetch changed the engine's outputs"
    assert pushed != held


def test_a_version_lacking_one_of_the_models_tensors_is_refused_before_writing(run):
    """Issue 64 finding 7, with ``at=`` (commit at init): a version that lacks a tensor was
    loaded, the missing tensor keeping the version before's values; a fresh engine refuses it."""
    trainer, llm, attached, last = run
    held = attached.commit
    sd = {k: v for k, v in trainer.sd.items() if k != "model.norm.weight"}
    bad = trainer.commit_other(sd, "lacks the final norm")
    with pytest.raises(WvcError, match="lacks model.norm.weight"):
        attached.update(bad)
    assert attached.commit == held and engine.probe(llm) == last["probe"]


def test_a_failure_while_writing_into_the_engine_marks_it_unusable(run, monkeypatch, tmp_path):
    """(Last in this module: it leaves the engine unusable.) A reload that fails midway
    cannot be undone: the update says so, and every later one refuses with the reason."""
    trainer, llm, attached, last = run
    needs_packed_weights(llm)
    commit = trainer.step([Q0, "model.norm.weight"])

    def failing_reload(*args, **kwargs):
        raise RuntimeError("reload interrupted")

    monkeypatch.setattr(engine_weights, "_reload", failing_reload)
    with pytest.raises(EngineUnusable, match="reload interrupted"):
        attached.update(commit)
    monkeypatch.undo()
    with pytest.raises(EngineUnusable, match="restarted"):
        attached.update()
    info = attached.info()[0]
    assert info["commit"] is None and "reload interrupted" in info["unusable"]
