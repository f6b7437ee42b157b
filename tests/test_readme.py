"""Every code block of the README and the guides runs as written (issue 66; the README's main
block since issue 37): each fenced ``bash`` and ``python`` block of README.md, docs/index.md
and docs/guides/*.md, in page order, in one working directory a page, or it says on the line
before it why it is not run here::

    <!-- docs-test: skip: needs vLLM; tests_vllm/test_trl.py runs this block -->

The world a page starts in is what its text assumes: ``my-model/`` (a bf16 model and its
config), ``trained/`` (a fine-tune of it), the local Hub server (``HF_ENDPOINT``) holding that
model as ``org/base-model``, and ``wvc`` on the PATH. A ``# ... train`` line stands for a
training run: it moves every weight of ``model.safetensors`` where it runs; ``/tmp/`` is a
folder of the page's own (pages run side by side). Bash blocks run
under ``set -euo pipefail``; each block starts where the one before it left off (its last
``cd``)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", ROOT / "docs" / "index.md", *sorted((ROOT / "docs" / "guides").glob("*.md"))]
# the pages of the three paths a user comes for: each starts with a block they can paste
PATHS = ["public-bases.md", "training-loops.md", "rl.md"]
RUN = ("bash", "python")
SKIP = re.compile(r"<!--\s*docs-test:\s*skip:(.*?)-->")

TRAIN = textwrap.dedent("""\
    {python} - <<'PY'
    import torch
    from safetensors.torch import load_file, save_file
    sd = load_file("model.safetensors")
    g = torch.Generator().manual_seed(int(torch.randint(0, 1 << 30, ()).item()))
    save_file({{k: (v.float() + 1e-3 * torch.randn(v.shape, generator=g)).to(v.dtype) if v.is_floating_point() else v
               for k, v in sd.items()}},
              "model.safetensors")
    PY""")


@dataclass
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    skip: str | None  # why it is not run here

    @property
    def where(self) -> str:
        return f"{_shown(self.page)}:{self.line}"


def _shown(page: Path) -> str:
    """A page as a message names it: from the project's root, or by its name elsewhere."""
    return str(page.relative_to(ROOT)) if page.is_relative_to(ROOT) else page.name


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of ``page`` (any language), each with the skip reason the line
    before it gives; a skip marker with no reason is an error."""
    lines = page.read_text().splitlines()
    out, k = [], 0
    while k < len(lines):
        m = re.match(r"^```(\w*)\s*$", lines[k])
        if not m:
            k += 1
            continue
        end = next(j for j in range(k + 1, len(lines)) if lines[j].startswith("```"))
        before = next((lines[j] for j in range(k - 1, -1, -1) if lines[j].strip()), "")
        skip = SKIP.search(before)
        reason = skip.group(1).strip() if skip else None
        if skip and not reason:
            raise AssertionError(f"{_shown(page)}:{k + 1}: a docs-test skip must say why")
        out.append(Block(page, k + 1, m.group(1), "\n".join(lines[k + 1 : end]) + "\n", reason))
        k = end + 1
    return out


def run_page(page: Path, cwd: Path, env: dict) -> list[str]:
    """Run the page's blocks in order from ``cwd``; fails the test at the first block that
    fails, naming it. Returns the stdout of each block run."""
    state = cwd / ".docs-test-cwd"
    scratch = cwd / "tmp"  # the page's /tmp/
    scratch.mkdir(exist_ok=True)
    here, outputs = cwd, []
    for block in blocks(page):
        if block.lang not in RUN or block.skip:
            continue
        if block.lang == "bash":
            body = "\n".join(TRAIN.format(python=sys.executable) if ln.lstrip().startswith("# ... train") else ln
                             for ln in block.code.replace("/tmp/", f"{scratch}/").splitlines())
            script = f"set -euo pipefail\ncd {str(here)!r}\n{body}\npwd > {str(state)!r}\n"
            r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=600, env=env)
        else:
            r = subprocess.run([sys.executable, "-"], input=block.code, cwd=here, capture_output=True, text=True,
                               timeout=600, env=env)
        if r.returncode != 0:
            pytest.fail(f"{block.where}: the {block.lang} block failed (exit {r.returncode}):\n"
                        f"{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
        if block.lang == "bash":
            here = Path(state.read_text().strip())
        outputs.append(r.stdout)
    return outputs


def save_model(directory: Path, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    directory.mkdir(parents=True, exist_ok=True)
    save_file({"layer.0.weight": torch.randn(64, 64, generator=g).to(torch.bfloat16),
               "layer.1.weight": torch.randn(64, 64, generator=g).to(torch.bfloat16)}, str(directory / "model.safetensors"))
    (directory / "config.json").write_text('{"model_type": "toy", "hidden_size": 64}\n')


@pytest.fixture
def world(tmp_path, monkeypatch):
    """The directory a page starts in, and the environment its blocks run with (a Hub server
    of its own: pages push to the same repository names)."""
    from huggingface_hub import HfApi

    from wvc.testing.hub import HubServer

    from .conftest import TOKEN

    hub = HubServer(tmp_path / "hub", token=TOKEN).start()
    for key, value in {"HF_ENDPOINT": hub.base_url, "HF_TOKEN": TOKEN, "HF_HUB_DISABLE_TELEMETRY": "1",
                       "HF_HUB_CACHE": str(tmp_path / "hf-cache"), "HF_XET_CACHE": str(tmp_path / "xet-cache")}.items():
        monkeypatch.setenv(key, value)

    work = tmp_path / "work"
    save_model(work / "my-model", seed=0)
    save_model(work / "base", seed=0)
    api = HfApi(endpoint=hub.base_url, token=TOKEN)
    api.create_repo("org/base-model", exist_ok=True)
    api.upload_folder(folder_path=str(work / "base"), repo_id="org/base-model")
    save_model(work / "trained", seed=0)  # a fine-tune of the base: every weight moved a little
    subprocess.run(["bash", "-c", TRAIN.format(python=sys.executable)], cwd=work / "trained", check=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "wvc").write_text(f"#!/bin/sh\nexec {sys.executable} -m wvc \"$@\"\n")
    (bin_dir / "wvc").chmod(0o755)
    monkeypatch.setenv("WVC_CACHE", str(tmp_path / "wvc-cache"))
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(ROOT)}
    yield work, env
    hub.shutdown()


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_the_blocks_of_each_page_run_as_written(page, world):
    work, env = world
    outputs = run_page(page, work, env)
    if page.name == "README.md":  # (its main block, as issue 37 checked it)
        assert (work / "tmp" / "old-version" / "model.safetensors").is_file()
        assert any("Merged lr-sweep" in out for out in outputs)


def test_every_block_is_run_or_says_why_not_and_each_paths_page_starts_runnable():
    found = {page: blocks(page) for page in PAGES}
    for page, bs in found.items():
        for b in bs:
            assert b.lang in RUN + ("text",), f"{b.where}: a block in {b.lang or 'no language'}: name it bash, python or text"
    run = [b for bs in found.values() for b in bs if b.lang in RUN and not b.skip]
    assert len(run) >= 15, len(run)
    for name in PATHS:
        page = ROOT / "docs" / "guides" / name
        first = next(b for b in found[page] if b.lang in RUN)
        assert first.skip is None, f"{first.where}: the first block of a path's page must run as written"


def test_a_block_changed_to_fail_fails_the_page(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("intro\n\n```bash\necho fine\n```\n\n```python\nraise SystemExit(3)\n```\n")
    with pytest.raises(pytest.fail.Exception, match=r"page.md:7: the python block failed \(exit 3\)"):
        run_page(page, tmp_path, dict(os.environ))
    page.write_text("```bash\necho fine\nfalse\necho never\n```\n")
    with pytest.raises(pytest.fail.Exception, match="the bash block failed"):
        run_page(page, tmp_path, dict(os.environ))
    page.write_text("<!-- docs-test: skip: -->\n```bash\necho fine\n```\n")
    with pytest.raises(AssertionError, match="must say why"):
        run_page(page, tmp_path, dict(os.environ))
    page.write_text("<!-- docs-test: skip: shown, not run -->\n```bash\nfalse\n```\n")
    assert run_page(page, tmp_path, dict(os.environ)) == []


def test_the_readmes_trl_block_is_the_guides_which_the_vllm_suite_runs():
    def trl_block(page):
        return next(b.code for b in blocks(page) if "WvcWeightTransfer(" in b.code)

    assert trl_block(ROOT / "README.md") == trl_block(ROOT / "docs" / "guides" / "rl.md")
