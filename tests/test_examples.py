"""Every example in examples/ runs to completion."""

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).parent.parent / "examples"


@pytest.mark.parametrize("script, extra", [
    ("branching_experiments.py", []),
    ("team_sync.py", []),
    ("finetune_of_hub_base.py", []),
    ("finetune_with_callback.py", ["--steps", "4"]),
    ("merge_experiments.py", ["--steps", "2"]),
    ("live_sync.py", ["--steps", "3"]),
])
def test_example_runs(script, extra, tmp_path):
    r = subprocess.run([sys.executable, str(EXAMPLES / script), "--dir", str(tmp_path / "run"), *extra],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert r.stdout.strip()
