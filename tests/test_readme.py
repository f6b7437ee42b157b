"""The README's main snippet runs as written (issue 37, finding 17): the "Using it" block,
line by line under `set -e`, on a real model file that each "train" line changes."""

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import torch
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parent.parent

TRAIN = textwrap.dedent("""\
    {python} - <<'PY'
    import torch
    from safetensors.torch import load_file, save_file
    sd = load_file("model.safetensors")
    g = torch.Generator().manual_seed(int(torch.randint(0, 1 << 30, ()).item()))
    save_file({{k: (v.float() + 1e-3 * torch.randn(v.shape, generator=g)).to(v.dtype) for k, v in sd.items()}},
              "model.safetensors")
    PY""")


def using_it_block() -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Using it"):]
    return re.search(r"```bash\n(.*?)```", section, re.S).group(1)


def test_the_using_it_snippet_runs_as_written(tmp_path):
    model = tmp_path / "my-model"
    model.mkdir()
    g = torch.Generator().manual_seed(0)
    save_file({"layer.0.weight": torch.randn(64, 64, generator=g).to(torch.bfloat16),
               "layer.1.weight": torch.randn(64, 64, generator=g).to(torch.bfloat16)}, str(model / "model.safetensors"))
    lines = []
    for line in using_it_block().splitlines():
        if line.startswith("# ... train"):
            lines.append(TRAIN.format(python=sys.executable))
        else:
            lines.append(line.replace("/tmp/old-version", str(tmp_path / "old-version")).replace("wvc ", f"{sys.executable} -m wvc "))
    script = "set -euo pipefail\ncd " + str(tmp_path) + "\n" + "\n".join(lines) + "\n"
    r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    assert (tmp_path / "old-version" / "model.safetensors").is_file()
    assert "Merged lr-sweep" in r.stdout
