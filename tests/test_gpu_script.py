"""benchmarks/gpu.py runs as one command; without a GPU it runs on torch's CPU kernels
(``--device torch-cpu``): every version loads back and follows bit for bit, and both paths
store the same bytes."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_gpu_benchmark_runs_on_torch_cpu_and_checks_every_version(tmp_path):
    out = tmp_path / "gpu.json"
    r = subprocess.run([sys.executable, "-m", "benchmarks.gpu", "--device", "torch-cpu", "--sizes", "0.03", "--hidden", "256",
                        "--profile-gb", "0.01",
                        "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["device"] == "cpu (torch kernels)"
    (result,) = report["results"]
    assert result["stored_equal"]
    for path in ("device_path", "c_path"):
        rows = result[path]["rows"]
        assert [row["version"] for row in rows] == ["initial", "adam step", "rl step (1%)"]
        assert all(row["exact"] and row["follow_exact"] for row in rows), rows
    # the RL step (1% of the elements) stores far less than the model
    assert result["c_path"]["rows"][2]["stored_bytes"] < result["bytes"] / 10
    # the C path is measured with every core of the machine, and a device-path commit is profiled
    assert int(report["codec_threads"]) == min(64, os.cpu_count())
    profiled = (tmp_path / "gpu_profile.txt").read_text()
    assert "## torch.profiler" in profiled and "## cProfile" in profiled and "aten::argsort" in profiled
