"""The RL guide's offline vLLM snippet (docs/guides/rl.md) runs as written (issue 64 finding 13): only the model
directory, the remote and the commit are put in for the placeholders, in a process of its
own (vLLM starts worker processes; the snippet's ``__main__`` guard is part of what is tested).
The TRL snippet runs in test_trl.py."""

import os
import re
import subprocess
import sys
from pathlib import Path

import torch

from .conftest import Trainer
from .engine import ENGINE_ENV

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guides" / "rl.md"


def offline_snippet() -> str:
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), re.S)
    (block,) = [b for b in blocks if "wvc.integrations.vllm.attach" in b]
    return block


def test_the_rl_guides_offline_vllm_snippet_runs_as_written(tmp_path):
    trainer = Trainer(tmp_path, tied=False, dtype=torch.bfloat16)
    start_dir = trainer.checkout(trainer.first)
    commit = trainer.step(["model.layers.0.mlp.up_proj.weight"])
    code = offline_snippet()
    for was, now in (('"/models/policy"', repr(str(start_dir))), ('"hf://team/policy"', repr(trainer.remote)),
                     ("at=COMMIT", f"at={trainer.first!r}")):
        assert was in code, was
        code = code.replace(was, now)
    code += "    print('HOLDS', engine.commit)\n"
    script = tmp_path / "snippet.py"
    script.write_text(code)
    env = {**os.environ, **ENGINE_ENV}
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING")  # as a user runs it: vLLM's own process layout
    r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"HOLDS {commit}" in r.stdout
