"""Starting a small vLLM engine on 2 cores, and probing it: greedy tokens, top-5 logprobs of
each generated token and of each prompt token, compared exactly (vLLM's CPU outputs were
bit-identical across runs, processes and thread settings: ../shared/research/vllm.md)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

ENGINE_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
              "VLLM_LOGGING_LEVEL": "WARNING", "TOKENIZERS_PARALLELISM": "false"}
PROMPTS = ["the cat sat on the mat and", "one two three four", "why did the big red dog run",
           "a small blue cat near the green mat"]
KV_BYTES = 64 << 20


def engine_kwargs() -> dict:
    return dict(enforce_eager=True, distributed_executor_backend="uni", kv_cache_memory_bytes=KV_BYTES,
                max_model_len=128, max_num_seqs=8, seed=0, enable_prefix_caching=True)


def start(model_dir, *, packing: bool = True, **extra):
    """An in-process engine. ``packing=False``: the CPU backend's linear layers keep plain
    weights (what GPUs use), for the patch path."""
    from vllm import LLM

    os.environ.update(ENGINE_ENV)
    if not packing:
        keep_plain_weights()
    return LLM(model=str(model_dir), **engine_kwargs(), **extra)


def start_tp(model_dir, tp: int = 2, **extra):
    """An engine with ``tp`` tensor-parallel worker processes (vLLM's multiprocessing
    executor, spawned), driven from this process."""
    from vllm import LLM

    os.environ.update({**ENGINE_ENV, "VLLM_ENABLE_V1_MULTIPROCESSING": "1", "VLLM_WORKER_MULTIPROC_METHOD": "spawn"})
    return LLM(model=str(model_dir), **{**engine_kwargs(), "distributed_executor_backend": "mp",
                                        "tensor_parallel_size": tp}, **extra)


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (an engine's core and worker processes), those still there."""
    out, todo = set(), [pid]
    while todo:
        p = todo.pop()
        try:
            for task in Path(f"/proc/{p}/task").iterdir():
                todo.extend(int(c) for c in (task / "children").read_text().split())
        except OSError:  # (gone meanwhile)
            continue
        out.add(p)
    return sorted(out)


def keep_plain_weights() -> None:
    """Turn off the CPU backend's weight packing in this process: linear layers compute with
    torch's linear on their own parameters, as on a GPU."""
    import torch
    from vllm.model_executor.layers import utils

    def plain(layer, remove_weight):
        layer.cpu_linear = lambda x, weight, bias: torch.nn.functional.linear(x, weight, bias)

    utils.dispatch_cpu_unquantized_gemm = plain


def probe(llm) -> list:
    """Each prompt's greedy continuation with its tokens' and its prompt's top-5 logprobs."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=8, logprobs=5, prompt_logprobs=5, seed=0)
    out = []
    for r in llm.generate(PROMPTS, params, use_tqdm=False):
        c = r.outputs[0]
        out.append({"tokens": list(c.token_ids),
                    "logprobs": [_top(lp) for lp in c.logprobs],
                    "prompt_logprobs": [None if lp is None else _top(lp) for lp in r.prompt_logprobs]})
    return out


def _top(lp: dict) -> list:
    return sorted([int(t), float(v.logprob)] for t, v in lp.items())


def fresh_probe(model_dir, *, packing: bool = True) -> list:
    """The probe of a fresh engine started from ``model_dir``, in a process of its own."""
    env = {**os.environ, **ENGINE_ENV}
    args = [] if packing else ["--plain"]
    res = subprocess.run([sys.executable, str(Path(__file__)), str(model_dir), *args], env=env, capture_output=True,
                         text=True, timeout=600)
    if res.returncode != 0:
        raise RuntimeError(f"fresh engine on {model_dir} failed:\n{res.stderr[-4000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def values(probe_out: list) -> int:
    """How many logprob values a probe compares."""
    n = 0
    for r in probe_out:
        n += sum(len(x) for x in r["logprobs"]) + sum(len(x) for x in r["prompt_logprobs"] if x is not None)
    return n


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def server(model_dir, log_path, *, wvc_backend: bool, remote=None, branch=None, api_key=None, env_extra=None,
           tp: int = 1, started=None):
    """A vLLM server on 127.0.0.1 (its base URL), with the ``wvc`` weight-transfer backend
    following ``remote`` (WVC_VLLM_REMOTE: whoever starts the server fixes it) or without,
    stopped on exit; its output in ``log_path``. ``api_key``: its --api-key. ``tp``: its
    tensor-parallel size (worker processes). ``started``: a list the server's process is
    appended to."""
    port = _free_port()
    env = {**os.environ, **ENGINE_ENV, "VLLM_SERVER_DEV_MODE": "1", **(env_extra or {})}
    if remote is not None:
        env["WVC_VLLM_REMOTE"] = str(remote)
    if branch is not None:
        env["WVC_VLLM_BRANCH"] = branch
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING")  # the server's own process layout
    args = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir), "--host",
            "127.0.0.1", "--port", str(port), "--enforce-eager", "--max-model-len", "128", "--max-num-seqs", "8",
            "--kv-cache-memory-bytes", str(KV_BYTES), "--seed", "0"]
    args += ["--distributed-executor-backend", "uni"] if tp == 1 else [
        "--distributed-executor-backend", "mp", "--tensor-parallel-size", str(tp)]
    if wvc_backend:
        args += ["--weight-transfer-config", json.dumps({"backend": "wvc"})]
    if api_key is not None:
        args += ["--api-key", api_key]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT)
        if started is not None:
            started.append(proc)
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 300
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"the server exited: {Path(log_path).read_text()[-3000:]}")
                try:
                    with urllib.request.urlopen(base + "/health", timeout=5) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError("the server did not become healthy in 300 s")
                time.sleep(0.5)  # (polling a starting server: no event to wait on)
            yield base
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    import logging

    logging.disable(logging.WARNING)
    print(json.dumps(probe(start(sys.argv[1], packing="--plain" not in sys.argv))))
