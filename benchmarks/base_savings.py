"""What a fine-tune of a public base costs to push: uploaded bytes versus the base's size.

    python3 -m benchmarks.base_savings            # writes benchmarks/results/base_savings.md
    python3 -m benchmarks.base_savings --quick    # without the 1 GB LLM-shaped case

For each case a base model directory is published to a local Hub-compatible server with
plain ``huggingface_hub.upload_folder`` (as any public model is), then
``wvc init --base hf://org/base``, the fine-tune's files are committed and pushed to a
fresh Hub remote. The push's ``uploaded_bytes`` (every byte sent: packs, commits, trees,
base.json) is compared with the size of the model's files, which is what an upload
without wvc sends. A clone in a fresh huggingface_hub cache then rebuilds the fine-tune
and each file's sha256 is compared with the original.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from . import cases as C

RESULTS = Path(__file__).parent / "results"
TOKEN = "bench"
_n = itertools.count()


def _sha(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _files(d: Path) -> dict[str, Path]:
    return {p.relative_to(d).as_posix(): p for p in d.rglob("*") if p.is_file() and not p.name.startswith(".")}


def measure(name: str, base_dir: Path, tuned_dir: Path, hub_url: str, tmp: Path) -> dict:
    from huggingface_hub import HfApi

    from wvc import Repo, clone

    n = next(_n)
    api = HfApi(endpoint=hub_url, token=TOKEN)
    base_repo = f"org/base-{n}"
    api.create_repo(base_repo, private=False)
    staged = tmp / f"upload-{n}"
    shutil.copytree(base_dir, staged, ignore=shutil.ignore_patterns(".*"))
    api.upload_folder(folder_path=str(staged), repo_id=base_repo)
    shutil.rmtree(staged)

    work = tmp / f"work-{n}"
    t = time.perf_counter()
    repo = Repo.init(work, base=f"hf://{base_repo}")
    init_s = time.perf_counter() - t
    for rel, src in _files(tuned_dir).items():
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, work / rel)
    t = time.perf_counter()
    result = repo.commit(name)
    commit_s = time.perf_counter() - t
    repo.remote_add("origin", f"hf://team/ft-{n}")
    pushed = repo.push()
    wvc_dir = sum(p.stat().st_size for p in repo.internals.wvc_dir.rglob("*") if p.is_file())

    os.environ["HF_HUB_CACHE"] = str(tmp / f"clone-cache-{n}")
    copy = clone(f"hf://team/ft-{n}", tmp / f"clone-{n}")
    identical = all(_sha(copy.root / rel) == _sha(src) for rel, src in _files(tuned_dir).items())
    os.environ["HF_HUB_CACHE"] = str(tmp / "cache")
    full = sum(p.stat().st_size for p in _files(tuned_dir).values())
    out = {"case": name, "model_bytes": full, "uploaded_bytes": pushed.uploaded_bytes,
           "stored_bytes": result.stored_bytes, "wvc_dir_bytes": wvc_dir, "ratio": full / pushed.uploaded_bytes,
           "init_s": round(init_s, 2), "commit_s": round(commit_s, 2), "byte_identical": identical}
    for d in (work, copy.root):
        shutil.rmtree(d, ignore_errors=True)
    print(json.dumps(out), flush=True)
    return out


def cases(quick: bool) -> list[tuple[str, str, Path, Path]]:
    mini = C.minilm_finetune()
    out = [
        ("full fine-tune, bf16, 200 AdamW steps (MiniLM, real weights)", "full", mini["bf16"][0], mini["bf16"][200]),
        ("full fine-tune, bf16, 1 step (MiniLM)", "full", mini["bf16"][0], mini["bf16"][1]),
        ("full fine-tune, fp32, 200 steps (MiniLM)", "full", mini["fp32"][0], mini["fp32"][200]),
    ]
    if not quick:
        llm = C.llm_bf16(1.0)
        out.append(("full fine-tune, bf16, 1 Adam step lr 1e-5 (1 GB LLM-shaped)", "full", llm[0], llm[1]))
    partial = C.partial_finetunes()
    out += [
        ("last quarter of the layers trained, rest frozen (256 MB)", "partial", *partial["frozen-layers"]),
        ("rank-16 LoRA merged into q/v (256 MB)", "partial", *partial["merged-lora"]),
        ("1000 token rows appended to embeddings and head (256 MB)", "partial", *partial["new-embedding-rows"]),
    ]
    for f, dirs in C.rl_steps().items():
        out.append((f"RL step: {f:.0%} of elements move 1-2 ULP (256 MB)", "sparse", *dirs))
    return [(n, k, Path(a), Path(b)) for n, k, a, b in out]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="skip the 1 GB LLM-shaped case")
    args = ap.parse_args(argv)
    from huggingface_hub import constants
    from huggingface_hub.utils import disable_progress_bars

    from wvc.testing.hub import HubServer

    disable_progress_bars()
    rows = []
    with tempfile.TemporaryDirectory(prefix="wvc-base-bench-") as tmp:
        tmp = Path(tmp)
        server = HubServer(tmp / "hub", token=TOKEN).start()
        os.environ.update(HF_ENDPOINT=server.base_url, HF_TOKEN=TOKEN, HF_HUB_DISABLE_XET="1",
                          HF_HUB_CACHE=str(tmp / "cache"), HF_HUB_DISABLE_TELEMETRY="1")
        constants.HF_HUB_DISABLE_XET = True
        try:
            for name, kind, base, tuned in cases(args.quick):
                rows.append({"kind": kind, **measure(name, base, tuned, server.base_url, tmp)})
        finally:
            server.shutdown()
    RESULTS.mkdir(exist_ok=True)
    lines = ["| fine-tune | model | pushed by wvc | smaller by | commit s | byte-identical clone |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['case']} | {r['model_bytes'] / 1e6:.1f} MB | {r['uploaded_bytes'] / 1e6:.2f} MB | "
                     f"{r['ratio']:.1f}x | {r['commit_s']} | {'yes' if r['byte_identical'] else 'NO'} |")
    (RESULTS / "base_savings.md").write_text("\n".join(lines) + "\n")
    (RESULTS / "base_savings.json").write_text(json.dumps(rows, indent=2) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
