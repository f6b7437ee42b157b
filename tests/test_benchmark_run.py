"""benchmarks/run.py measures a case end to end: a tiny one here, so a change to the
benchmark's plumbing (its child-process records grew a field once, and every case then
failed to unpack them) shows in the suite, not only on the next benchmark run."""

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from benchmarks import run
from benchmarks.baselines import full_copy
from benchmarks.cases import Case


@pytest.mark.skipif(shutil.which("zstd") is None, reason="the benchmark compares against the zstd command")
def test_a_case_is_measured_end_to_end(tmp_path: Path, monkeypatch):
    g = torch.Generator().manual_seed(0)
    base = {"w": torch.randn(256, 64, generator=g).to(torch.bfloat16), "b": torch.randn(64, generator=g)}
    tuned = {k: (v.float() + torch.randn(v.shape, generator=g) * 1e-3).to(v.dtype) for k, v in base.items()}
    versions = []
    for step, weights in ((0, base), (1, tuned)):
        d = tmp_path / f"step{step}"
        d.mkdir()
        save_file(weights, d / "model.safetensors")
        versions.append(d)
    monkeypatch.setattr(run, "BASELINES", {"full copy (LFS/DVC)": full_copy})  # (the others need the bench extra)
    scratch = tmp_path / "scratch"
    scratch.mkdir()

    row = run.measure_case(Case("tiny", "test", versions), scratch)

    assert row["byte_identical"] is True
    new = versions[-1] / "model.safetensors"
    assert row["raw_bytes"] == new.stat().st_size
    assert row["stored"]["full copy (LFS/DVC)"] == new.stat().st_size
    assert 0 < row["stored"]["wvc"] < new.stat().st_size
    for key in ("wvc_commit_s", "wvc_commit_cpu_s", "wvc_checkout_s", "wvc_checkout_cpu_s", "zstd_d_s"):
        assert row[key] > 0, key
    assert row["wvc_commit_rss"] > 0 and row["wvc_checkout_rss"] > 0


def test_the_step_decode_benchmark_keeps_each_coder_apart(tmp_path: Path):
    """benchmarks/step_decode.py once filed every coder's chain under the name "tip" (a loop
    variable shadowed the coder's), so its table showed one row for four coders."""
    import json

    from benchmarks import step_decode
    from benchmarks.long_run import RESULTS, synthetic_steps

    cal = json.loads((RESULTS / "long_run_1000.json").read_text())["runs"]["synthetic"]["calibration"]
    versions = [step_decode._flat(s) for _, s in synthetic_steps(3, 0.05, cal, seed=1)]
    links = step_decode.links(versions, repeats=1)
    chains = step_decode.chain(3, 0.05, cal, repeats=1, work=tmp_path)
    assert set(chains) == {"ULP_STEP", "STEP_BLOCKS", "STEP_RUNS", "chosen"}
    assert all(r["tip_depth"] >= 1 and r["stored_bytes"] > 0 for r in chains.values())
    table = step_decode.markdown({"chain_steps": 3, "synthetic": links, "chain": chains})
    for name in chains:
        assert f"| {name} |" in table
