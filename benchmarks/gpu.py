"""Deltas on the GPU against the C path on the host, one script, nothing from the network.

    python -m benchmarks.gpu [--sizes 4 16] [--device cuda] [--out benchmarks/results/gpu.json]

For each size it builds an LLM-shaped bf16 model on ``--device`` (the shapes of the main
benchmark's LLM case; an fp32 master kept on the device), then on two fresh repositories:

- **device path**: ``repo.commit(source=<device state dict>, device=--device)``;
- **C path**: the same state dict copied to the host first (not timed), committed with
  ``device="cpu"`` (the C kernels, one thread per core).

Three commits each: the initial weights, an Adam-like step (every element of the master
moves by ~lr, published in bf16), an RL-like step (1% of the bf16 elements move by one unit
in the last place). Then each version is loaded back (``load_state_dict(device=...)``) and
compared bit for bit, and a follower holding device tensors (``wvc.follow(state_dict=...)``)
applies each step. Printed and written as JSON: GB/s of each operation on both paths, the
training pause per commit (a synchronous commit: its wall time), peak device and host
memory, stored bytes (which must be equal on both paths: the payloads are byte-identical).

On a machine without a GPU, ``--device torch-cpu --sizes 0.05`` runs the same script with
torch's CPU kernels in place of CUDA (how the tests run it).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import tempfile
import time
from pathlib import Path

# The C path with every core of the machine (the codec pool's default stops at 4 threads):
# the issue compares against the host's full width. Set before wvc is imported.
os.environ.setdefault("WVC_CODEC_THREADS", str(min(64, os.cpu_count() or 1)))

import torch  # noqa: E402

RESULTS = Path(__file__).parent / "results"


HIDDEN = 2048  # the LLM shapes' width (--hidden: the tests build a narrower, smaller model)


def llm_on_device(size_gb: float, device: str, seed: int = 0) -> dict[str, torch.Tensor]:
    from .cases import llm_shapes

    g = torch.Generator(device=device).manual_seed(seed)
    master = {}
    for name, shape in llm_shapes(size_gb * 1e9, hidden=HIDDEN).items():
        if name.endswith("norm.weight"):
            master[name] = 1.0 + 0.05 * torch.randn(shape, generator=g, device=device)
        else:
            std = 0.02 if "embed" in name or "lm_head" in name else shape[-1] ** -0.5
            master[name] = torch.randn(shape, generator=g, device=device) * std
    return master


def adam_like(master: dict, lr: float = 1e-5, seed: int = 7) -> None:
    g = torch.Generator(device=next(iter(master.values())).device).manual_seed(seed)
    for w in master.values():
        w.add_(torch.randn(w.shape, generator=g, device=w.device).clamp_(-3, 3), alpha=-lr)


def rl_like(weights: dict, fraction: float = 0.01, seed: int = 11) -> None:
    """One unit in the last place on ``fraction`` of the bf16 elements (in place)."""
    g = torch.Generator(device=next(iter(weights.values())).device).manual_seed(seed)
    for w in weights.values():
        bits = w.view(torch.int16).reshape(-1)
        idx = torch.randint(0, bits.numel(), (max(1, int(bits.numel() * fraction)),), generator=g, device=w.device)
        bits[idx] += 1


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def same_bits(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k].view(torch.int16), b[k].to(a[k].device).view(torch.int16))
                                        for k in a)


def host_peak_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run_size(size_gb: float, codec_device: str, work: Path) -> dict:
    """``codec_device``: cuda[:N], or torch-cpu (torch's kernels on the host)."""
    import wvc
    from wvc import Repo

    device = "cpu" if codec_device == "torch-cpu" else codec_device  # where the tensors live
    master = llm_on_device(size_gb, device)
    versions = []
    weights = {k: v.to(torch.bfloat16) for k, v in master.items()}
    versions.append(("initial", weights))
    adam_like(master)
    weights = {k: v.to(torch.bfloat16) for k, v in master.items()}
    versions.append(("adam step", weights))
    weights = {k: v.clone() for k, v in weights.items()}
    rl_like(weights)
    versions.append(("rl step (1%)", weights))
    del master
    nbytes = sum(t.numel() * t.element_size() for t in versions[0][1].values())
    out = {"size_gb": size_gb, "bytes": nbytes, "device_path": {}, "c_path": {}}

    for path_name, commit_device in (("device_path", codec_device), ("c_path", "cpu")):
        repo_dir = work / f"{path_name}-{size_gb:g}"
        repo = Repo.init(repo_dir)
        rows = []
        for label, sd in versions:
            source = sd if path_name == "device_path" else {k: v.cpu() for k, v in sd.items()}
            sync(device)
            t = time.perf_counter()
            res = repo.commit(label, source=source, device=commit_device)
            sync(device)
            seconds = time.perf_counter() - t
            rows.append({"version": label, "commit": res.commit, "commit_s": seconds,
                         "commit_gbps": nbytes / seconds / 1e9, "stored_bytes": res.stored_bytes})
        load_device = device if path_name == "device_path" else "cpu"
        for row, (label, sd) in zip(rows, versions):
            sync(device)
            t = time.perf_counter()
            got = repo.load_state_dict(row["commit"], device=load_device)
            sync(device)
            row["load_s"] = time.perf_counter() - t
            row["load_gbps"] = nbytes / row["load_s"] / 1e9
            row["exact"] = same_bits(got, sd)
            del got
        held = {k: torch.empty_like(v, device=load_device) for k, v in versions[0][1].items()}
        follower = wvc.follow(repo_dir, "main", state_dict=held)
        # the follower moves commit by commit: each version in turn as its rev
        for row, (label, sd) in zip(rows, versions):
            sync(device)
            t = time.perf_counter()
            follower.update(rev=row["commit"])
            sync(device)
            row["follow_s"] = time.perf_counter() - t
            row["follow_exact"] = same_bits(held, sd)
        repo.close()
        out[path_name] = {"rows": rows}
        shutil.rmtree(repo_dir, ignore_errors=True)
    out["stored_equal"] = [r["stored_bytes"] for r in out["device_path"]["rows"]] == \
        [r["stored_bytes"] for r in out["c_path"]["rows"]]
    if device.startswith("cuda"):
        out["peak_device_bytes"] = torch.cuda.max_memory_allocated()
    out["peak_host_bytes"] = host_peak_bytes()
    return out


def profile_commit(size_gb: float, codec_device: str, work: Path, top: int = 30) -> str:
    """torch.profiler (host and device) and cProfile (the host's Python) tables of one
    device-path commit of an Adam-like step: what bounds the device path, measured."""
    import cProfile
    import io
    import pstats

    from torch.profiler import ProfilerActivity, profile

    from wvc import Repo

    device = "cpu" if codec_device == "torch-cpu" else codec_device
    master = llm_on_device(size_gb, device)
    repo = Repo.init(work / f"profile-{size_gb:g}")
    repo.commit("initial", source={k: v.to(torch.bfloat16) for k, v in master.items()}, device=codec_device)
    adam_like(master)
    step = {k: v.to(torch.bfloat16) for k, v in master.items()}
    del master
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    python = cProfile.Profile()
    sync(device)
    t = time.perf_counter()
    with profile(activities=activities) as prof:
        python.enable()
        repo.commit("adam step", source=step, device=codec_device)
        python.disable()
        sync(device)
    seconds = time.perf_counter() - t
    repo.close()
    shutil.rmtree(work / f"profile-{size_gb:g}", ignore_errors=True)
    sort = "cuda_time_total" if device.startswith("cuda") else "cpu_time_total"
    stats = io.StringIO()
    pstats.Stats(python, stream=stats).sort_stats("tottime").print_stats(top)
    return (f"# device-path commit of an Adam-like step, {size_gb:g} GB bf16, {seconds:.2f} s under the profilers\n\n"
            f"## torch.profiler, by {sort}\n\n{prof.key_averages().table(sort_by=sort, row_limit=top)}\n\n"
            f"## cProfile, by own time (the host's threads other than the caller's are not in it)\n\n"
            f"{stats.getvalue()}")


def table(results: list[dict]) -> str:
    lines = ["| model | version | commit GB/s device / C | load GB/s device / C | follower apply s device / C "
             "| stored MB (both) | exact |", "|---|---|---|---|---|---|---|"]
    for r in results:
        for d, c in zip(r["device_path"]["rows"], r["c_path"]["rows"]):
            lines.append(f"| {r['size_gb']:g} GB | {d['version']} | {d['commit_gbps']:.2f} / {c['commit_gbps']:.2f} "
                         f"| {d['load_gbps']:.2f} / {c['load_gbps']:.2f} | {d['follow_s']:.2f} / {c['follow_s']:.2f} "
                         f"| {d['stored_bytes'] / 1e6:.1f}{'' if r['stored_equal'] else ' (differ!)'} "
                         f"| {d['exact'] and c['exact'] and d['follow_exact'] and c['follow_exact']} |")
    return "\n".join(lines)


def auto_choice(codec_device: str) -> dict:
    """What ``device="auto"`` picks here for device tensors and for host tensors, and the
    trial times it picked on (wvc/ops/device_choice.py)."""
    from wvc.codec import device_choice

    if not codec_device.startswith("cuda"):
        return {}
    out = {}
    for location in ("device", "host", "files"):
        chosen = device_choice.commit_device("auto", location)
        out[location] = {"chosen": chosen, "seconds": device_choice.MEASURED.get((codec_device, location), {})}
    return out


def main(argv=None) -> None:
    global HIDDEN
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=float, nargs="+", default=[4, 16], help="model sizes in GB")
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N, or torch-cpu (no GPU: for the tests)")
    ap.add_argument("--out", type=Path, default=RESULTS / "gpu.json")
    ap.add_argument("--profile-gb", type=float, default=None,
                    help="profile one device-path commit of a model this size (default: the first of "
                         "--sizes; 0: none); the tables go beside --out, as gpu_profile.txt")
    ap.add_argument("--hidden", type=int, default=HIDDEN, help="the model's width (the tests: 256)")
    args = ap.parse_args(argv)
    HIDDEN = args.hidden
    device = "cpu" if args.device == "torch-cpu" else args.device
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("no CUDA device here: use --device torch-cpu to try the script on the CPU")
    name = torch.cuda.get_device_name(device) if device.startswith("cuda") else "cpu (torch kernels)"
    results = []
    with tempfile.TemporaryDirectory(prefix="wvc-gpu-") as tmp:
        for size in args.sizes:
            r = run_size(size, args.device, Path(tmp))
            results.append(r)
            print(table([r]), flush=True)
        profile_gb = args.sizes[0] if args.profile_gb is None else args.profile_gb
        if profile_gb:
            profiled = profile_commit(profile_gb, args.device, Path(tmp))
            (args.out.parent / "gpu_profile.txt").parent.mkdir(parents=True, exist_ok=True)
            (args.out.parent / "gpu_profile.txt").write_text(profiled)
    report = {"device": name, "cpu_count": os.cpu_count(), "codec_threads": os.environ["WVC_CODEC_THREADS"],
              "torch": torch.__version__, "results": results, "auto": auto_choice(args.device)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(f"\non {name}, {os.cpu_count()} CPU cores\n" + table(results))


if __name__ == "__main__":
    main()
