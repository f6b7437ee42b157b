"""The README's main job: ``wvc demo`` versions a model end to end and verifies it."""

import json
import subprocess
import sys

from wvc.demo import run_demo


def test_demo_verifies_every_version_and_saves_storage(tmp_path):
    report = run_demo(tmp_path / "demo", steps=2, echo=lambda *_: None)
    assert report["verified"] is True
    assert report["versions"] == 5  # base, 2 steps, 2 experiment steps
    assert report["stored_bytes"] < report["logical_bytes"] / 2


def test_python_m_wvc_runs_the_cli(tmp_path):
    r = subprocess.run([sys.executable, "-m", "wvc", "init", str(tmp_path / "x"), "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["branch"] == "main"
