"""Long runs: per-step bytes, uploads, push and follower time, tip checkout and retention
over hundreds to thousands of committed steps (issue 36).

    python -m benchmarks.long_run [--real-steps 400] [--synthetic-steps 5000] [--synthetic-mb 8]
                                  [--hub] [--bucket] [--s3] [--out benchmarks/results/long_run.json]

Two runs, a commit per step, each pushed at once to a directory remote (and, with
``--hub``, to the local Hub server through the real huggingface_hub and hf_xet clients; with
``--bucket``, to a Storage Bucket there; with ``--s3``, to moto's S3 server on 127.0.0.1),
a follower (``wvc.follow``, in this process) on each remote updating after every push:

- **real**: all-MiniLM-L6-v2 with bf16 weights and bf16 AdamW state (lr 1e-5), on a
  synthetic regression task; the forward and backward run in fp32 on a copy of the bf16
  weights (this CPU's bf16 matmul is slow), the gradients go back to the bf16 parameters,
  so the sparsity is the bf16 optimizer's own.
- **synthetic**: a bf16 model of ``--synthetic-mb`` whose steps are drawn from what the real
  run measured (the changed fraction at the start and end, the distribution of the change in
  units in the last place, the chance an element that changed changes again next step and in
  the same direction), for ``--synthetic-steps`` steps.

Per step: stored bytes, uploaded bytes (directory and S3: the bytes wvc sent; Hub and bucket:
the request bytes the server and its Xet service received; server-side copies apart), follower bytes and seconds, push seconds, the
deepest chain of the tip's chunks, TRL's sparse bytes (6 bytes a changed element) and the
same with a full anchor every 20 steps; every ``--checkout-every`` steps the tip's checkout
against step 0's. At the end: ``prune --keep-every 100 --keep-last 10`` and what it freed.
With ``--publisher``, each step is committed and pushed by ``wvc.Publisher`` (what the Trainer
callback runs: raw chunks of the last commits kept, the push on its own thread), onto a branch
of its own, and flushed before the follower updates.
Results: the JSON, a markdown summary and a PNG of per-step bytes over the run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import tempfile
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).parent / "results"
TRL_ANCHOR_EVERY = 20


# -- the runs --------------------------------------------------------------------------------
def real_steps(steps: int, lr: float = 1e-5):
    """(step, state dict) for step 0..steps: bf16 weights and AdamW, fp32 matmuls on a copy."""
    from transformers import AutoModel

    from .cases import minilm_dir

    torch.manual_seed(0)
    model = AutoModel.from_pretrained(str(minilm_dir()), local_files_only=True).to(torch.bfloat16)
    shadow = AutoModel.from_pretrained(str(minilm_dir()), local_files_only=True).float()
    shadow.train()
    head = torch.nn.Linear(model.config.hidden_size, 4)
    params = dict(model.named_parameters())
    opt = torch.optim.AdamW(list(params.values()), lr=lr, weight_decay=0.0)
    g = torch.Generator().manual_seed(1)
    vocab = model.config.vocab_size
    yield 0, model.state_dict()
    for step in range(1, steps + 1):
        with torch.no_grad():
            for name, p in shadow.named_parameters():
                p.copy_(params[name])  # bf16 -> fp32 is exact
        ids = torch.randint(1000, vocab, (16, 64), generator=g)
        target = torch.stack([(ids % k).float().mean(1) / k for k in (2, 3, 5, 7)], 1)
        loss = torch.nn.functional.mse_loss(head(shadow(input_ids=ids).last_hidden_state.mean(1)), target)
        shadow.zero_grad()
        loss.backward()
        for name, p in shadow.named_parameters():
            params[name].grad = None if p.grad is None else p.grad.to(torch.bfloat16)
        opt.step()
        yield step, model.state_dict()


def _ordered(bits: torch.Tensor) -> torch.Tensor:
    """bf16 bits (int16) -> value-ordered int32."""
    b = bits.to(torch.int32)
    return torch.where(b >= 0, b, -(b & 0x7FFF))


def _unordered(o: torch.Tensor) -> torch.Tensor:
    return torch.where(o >= 0, o, (-o) | 0x8000).to(torch.int32).to(torch.int16)


class Calibration:
    """What the real run's steps look like, measured from consecutive versions."""

    def __init__(self):
        self.fractions: list[float] = []
        self.magnitudes = torch.zeros(17, dtype=torch.float64)  # |ulps| 1..15, 16: more
        self.again = [0, 0]  # changed at t-1: changed again at t / not
        self.same_sign = [0, 0]

    def add(self, prev_bits, cur_bits, prev_delta):
        d = _ordered(cur_bits) - _ordered(prev_bits)
        changed = d != 0
        self.fractions.append(changed.float().mean().item())
        mags = d[changed].abs().clamp(max=16)
        self.magnitudes += torch.bincount(mags, minlength=17)[:17].double()
        if prev_delta is not None:
            was = prev_delta != 0
            self.again[0] += int((changed & was).sum())
            self.again[1] += int(was.sum())
            both = changed & was
            self.same_sign[0] += int((torch.sign(d[both]) == torch.sign(prev_delta[both])).sum())
            self.same_sign[1] += int(both.sum())
        return d

    def to_json(self) -> dict:
        n = len(self.fractions)
        head, tail = self.fractions[: max(1, n // 10)], self.fractions[-max(1, n // 10):]
        p = (self.magnitudes / self.magnitudes.sum()).tolist()
        return {"changed_start": sum(head) / len(head), "changed_end": sum(tail) / len(tail),
                "ulp_distribution": p, "p_again": self.again[0] / max(1, self.again[1]),
                "p_same_sign": self.same_sign[0] / max(1, self.same_sign[1])}


def move_bits(bits: torch.Tensor, was: torch.Tensor | None, target: float, dist: torch.Tensor, p_again: float,
              p_same: float, g: torch.Generator) -> torch.Tensor:
    """Move bf16 ``bits`` (int16, in place) one calibrated step: ``target`` of the elements by
    1, 2, ... units in the last place (``dist``), an element that moved at the step before
    again with ``p_again``, the same way with ``p_same``. ``was``: each element's direction at
    the step before (int8 -1, 0, 1; None: no step before). Returns this step's directions."""
    r = torch.rand(bits.numel(), generator=g)
    if was is None:
        changed = r < target
    else:
        moved = was != 0
        frac = moved.float().mean().item()
        p_new = max(0.0, (target - frac * p_again) / max(1e-9, 1 - frac))  # fresh changes make up the rest
        changed = torch.where(moved, r < p_again, r < p_new)
    directions = torch.zeros(bits.numel(), dtype=torch.int8)
    k = int(changed.sum())
    if k == 0:  # (a small tensor may draw no change at all; multinomial refuses zero samples)
        return directions
    mags = torch.multinomial(dist, k, replacement=True, generator=g).to(torch.int32) + 1
    sign = torch.where(torch.rand(k, generator=g) < 0.5, 1, -1).to(torch.int32)
    if was is not None:
        keep = (was[changed] != 0) & (torch.rand(k, generator=g) < p_same)
        sign = torch.where(keep, was[changed].to(torch.int32), sign)
    o = _ordered(bits)
    o[changed] += mags * sign
    bits.copy_(_unordered(o))
    directions[changed] = sign.to(torch.int8)
    return directions


def synthetic_steps(steps: int, megabytes: float, cal: dict, seed: int = 0):
    """(step, state dict) of a bf16 model moved as the calibration says."""
    g = torch.Generator().manual_seed(seed)
    shapes = {"embed.weight": (4096, 256), "layer.0.attn.weight": (512, 512), "layer.0.mlp.weight": (1024, 512),
              "layer.0.norm.weight": (512,)}
    unit = sum(torch.Size(s).numel() for s in shapes.values()) * 2
    layers = max(1, round(megabytes * 1e6 / unit))
    state = {}
    for i in range(layers):
        for name, shape in shapes.items():
            n = name.replace("layer.0", f"layer.{i}") if i or "layer" in name else name
            if n in state:
                continue
            w = (1.0 + 0.05 * torch.randn(shape, generator=g)) if n.endswith("norm.weight") else \
                torch.randn(shape, generator=g) * 0.02
            state[n] = w.to(torch.bfloat16)
    dist = torch.tensor(cal["ulp_distribution"][1:], dtype=torch.float64)
    prev = {n: torch.zeros(t.numel(), dtype=torch.int8) for n, t in state.items()}
    yield 0, state
    for step in range(1, steps + 1):
        target = cal["changed_start"] + (cal["changed_end"] - cal["changed_start"]) * min(1.0, step / max(1, steps))
        for name, t in state.items():
            prev[name] = move_bits(t.view(torch.int16).reshape(-1), prev[name], target, dist, cal["p_again"],
                                   cal["p_same_sign"], g)
        yield step, state


# -- measures ----------------------------------------------------------------------------------
def digest(state) -> str:
    h = hashlib.sha256()
    for name in sorted(state):
        h.update(name.encode())
        h.update(state[name].detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def changed_elements(prev, cur) -> int:
    return sum(int((cur[n].view(torch.int16) != prev[n].view(torch.int16)).sum()) for n in cur if n in prev)


def tip_depth(repo, commit: str) -> int:
    tree = repo.internals.read_tree(repo.read_commit(commit).tree)
    rows = repo.internals.store.rows(tree.chunk_ids())
    return max((r.depth for r in rows.values()), default=0)


def checkout_seconds(repo, commit: str, out: Path) -> float:
    shutil.rmtree(out, ignore_errors=True)
    t = time.perf_counter()
    repo.checkout(commit, output=out)
    return time.perf_counter() - t


def load_seconds(repo, commit: str) -> float:
    t = time.perf_counter()
    repo.load_state_dict(commit)
    return time.perf_counter() - t


# Each tip measure is the median of this many, taken in turn with step 0's: one of each
# drifted by 25-35% on this machine, as much as the change a measure was meant to show.
REPEATS = 5


def in_turn(seconds, tip: str, first: str) -> tuple[float, float]:
    """(the tip's, step 0's) median ``seconds(commit)`` over REPEATS pairs taken in turn."""
    pairs = [(seconds(first), seconds(tip)) for _ in range(REPEATS)]
    return median([t for _, t in pairs]), median([f for f, _ in pairs])


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else None


def wire_bytes(server) -> int:
    """What the local Hub server and its Xet service were sent (request bodies)."""
    return sum(wire_by_kind(server).values())


def wire_by_kind(server) -> dict[str, int]:
    """The same by what each request was (``CountingServer.received_kind``): Xet xorbs and
    shards, the Hub commit (small files ride inline), preupload, a bucket's batch, ..."""
    out: dict[str, int] = {}
    for counts in (server.received_bytes, server.cas.received_bytes):
        for kind, n in counts.items():
            out[kind] = out.get(kind, 0) + n
    return out


def start_s3(work: Path) -> tuple[object, str]:
    """moto's S3 server (the tests' launcher, one request at a time) on 127.0.0.1, the AWS
    environment pointed at it, and a bucket: (the process, the bucket's name)."""
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, str(Path(__file__).parent.parent / "tests" / "s3_server.py"), str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.environ.update({"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "bench",
                       "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"})
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("the S3 server did not start")
            time.sleep(0.2)
    import boto3

    boto3.client("s3").create_bucket(Bucket="bench-long-run")
    return proc, "bench-long-run"


SERVED = ("hub", "bucket")  # remotes whose uploads the local Hub server counts as it receives them


def run(name: str, steps_iter, work: Path, *, hub_url: str | None, checkout_every: int, calibrate: Calibration | None,
        server=None, deadline: float | None = None, publisher: bool = False, bucket_url: str | None = None,
        s3_url: str | None = None):
    from wvc import Repo
    from wvc.integrations.publisher import Publisher
    import wvc

    repo = Repo.init(work / f"repo-{name}")
    remotes = {"dir": str(work / f"remote-{name}")}
    for r, url in (("hub", hub_url), ("bucket", bucket_url), ("s3", s3_url)):
        if url:
            remotes[r] = url
    for r, url in remotes.items():
        repo.remote_add(r, url)
    # --publisher: what the Trainer callback runs (a branch of its own, raw chunks kept, the
    # push on the Publisher's thread); each step flushed, so that it is measured on its own
    branch = "run/long" if publisher else "main"
    pub = Publisher(repo.root, branch, push_to=remotes["dir"], remote="dir") if publisher else None
    followers, rows, prev, prev_delta = {}, [], None, None
    first_commit = None
    for step, state in steps_iter:
        cur = {k: v.detach().clone().contiguous() for k, v in state.items()}
        want = digest(cur)
        if pub is not None:
            pub.publish(cur, message=f"step {step}", metadata={"step": step})
            if not pub.flush(timeout=600) or pub.errors:
                raise RuntimeError(f"the publisher failed at step {step}: {pub.errors}")
            res, pushed = pub.commits[-1], pub.pushes[-1]
            assert pushed["commit"] == res["commit"], "each step is pushed on its own"
            row = {"step": step, "commit_s": res["seconds"], "stored_bytes": res["stored_bytes"]}
            commit = res["commit"]
        else:
            t = time.perf_counter()
            res = repo.commit(f"step {step}", source=cur, metadata={"step": step}, branch=branch)
            row = {"step": step, "commit_s": time.perf_counter() - t, "stored_bytes": res.stored_bytes}
            commit = res.commit
        first_commit = first_commit or commit
        for r in remotes:
            if pub is not None:
                row[f"push_{r}_s"], row[f"upload_{r}_bytes"] = pushed["seconds"], pushed["uploaded_bytes"]
                row[f"compacted_{r}"] = pushed["files_replaced"]
            else:
                t = time.perf_counter()
                sent = wire_by_kind(server) if r in SERVED else {}
                pushed = repo.push(r, branch)
                row[f"push_{r}_s"] = time.perf_counter() - t
                # the Hub and a bucket: what reached the server (Xet: xorbs and shards; LFS: the
                # files), not what wvc handed over; S3 and a directory: what wvc sent
                if r in SERVED:
                    now = wire_by_kind(server)
                    row[f"upload_{r}_by_kind"] = {k: n - sent.get(k, 0) for k, n in now.items() if n != sent.get(k, 0)}
                    row[f"upload_{r}_bytes"] = sum(row[f"upload_{r}_by_kind"].values())
                else:
                    row[f"upload_{r}_bytes"] = pushed.uploaded_bytes
                row[f"copied_{r}_bytes"] = pushed.copied_bytes  # server-side copies (compose), apart
                row[f"compacted_{r}"] = pushed.files_replaced
            if r not in followers:
                followers[r] = wvc.follow(remotes[r], branch)
            t = time.perf_counter()
            update = followers[r].update()
            row[f"follow_{r}_s"] = time.perf_counter() - t
            row[f"follow_{r}_bytes"] = update.downloaded_bytes if update else 0
            row[f"exact_{r}"] = update is not None and update.commit == commit and \
                digest(followers[r].state_dict) == want
        row["tip_depth"] = tip_depth(repo, commit)
        if prev is not None:
            n = changed_elements(prev, cur)
            row["changed_elements"] = n
            row["trl_bytes"] = 6 * n
            row["trl_anchored_bytes"] = 6 * n + (sum(t.numel() * 2 for t in cur.values()) if step % TRL_ANCHOR_EVERY == 0 else 0)
            if calibrate is not None:
                names = sorted(cur)
                prev_bits = torch.cat([prev[k].view(torch.int16).reshape(-1) for k in names])
                cur_bits = torch.cat([cur[k].view(torch.int16).reshape(-1) for k in names])
                prev_delta = calibrate.add(prev_bits, cur_bits, prev_delta)
        if step and step % checkout_every == 0:
            row["checkout_tip_s"], row["checkout_first_s"] = in_turn(
                lambda c: checkout_seconds(repo, c, work / "co"), commit, first_commit)
            # in memory (Repo.load_state_dict)
            row["load_tip_s"], row["load_first_s"] = in_turn(lambda c: load_seconds(repo, c), commit, first_commit)
        rows.append(row)
        if step % 50 == 0:
            print(json.dumps({"run": name, **row}), flush=True)
        prev = cur
        if deadline is not None and time.monotonic() > deadline:
            print(json.dumps({"run": name, "stopped_at_step": step, "why": "--max-minutes"}), flush=True)
            break
    if pub is not None:
        assert pub.close(timeout=600), pub.errors
    # retention: what --keep-every 100 --keep-last 10 frees
    t = time.perf_counter()
    pruned = repo.prune(branch, keep={"every": 100, "last": 10})
    prune = {**pruned.to_json(), "seconds": time.perf_counter() - t}
    prune.pop("pruned_commits")
    repo.close()
    return rows, prune


def summarize(name: str, rows: list[dict], prune: dict, remotes) -> dict:
    after = [r for r in rows if r["step"] > 10] or rows[1:]
    out = {"run": name, "steps": len(rows) - 1, "all_exact": all(r[f"exact_{k}"] for r in rows for k in remotes)}
    stored = [r["stored_bytes"] for r in after]
    out["stored_median"] = median(stored)
    for k in remotes:
        fb = [r[f"follow_{k}_bytes"] for r in after]
        med = median(fb)
        out[k] = {
            "follower_median": med, "follower_max_over_median": max(fb) / med, "follower_mean_over_median":
                sum(fb) / len(fb) / med, "steps_over_2x_median": sum(1 for b in fb if b > 2 * med),
            "stored_mean_over_follower_median": sum(stored) / len(stored) / med,
            "upload_over_stored": sum(r[f"upload_{k}_bytes"] for r in rows[1:]) / sum(r["stored_bytes"] for r in rows[1:]),
            "copied_over_stored": sum(r.get(f"copied_{k}_bytes", 0) for r in rows[1:]) / sum(r["stored_bytes"] for r in rows[1:]),
            "follower_over_stored": sum(r[f"follow_{k}_bytes"] for r in rows[1:]) / sum(r["stored_bytes"] for r in rows[1:]),
            "push_s_first100_median": median([r[f"push_{k}_s"] for r in rows[1:101]]),
            "push_s_last100_median": median([r[f"push_{k}_s"] for r in rows[-100:]]),
            "follow_s_first100_median": median([r[f"follow_{k}_s"] for r in rows[1:101]]),
            "follow_s_last100_median": median([r[f"follow_{k}_s"] for r in rows[-100:]]),
            "compacting_pushes": sum(1 for r in rows if r[f"compacted_{k}"]),
        }
        if k in SERVED:  # where the uploads went, as the server counted them
            kinds: dict[str, int] = {}
            for r in rows[1:]:
                for kind, n in r.get(f"upload_{k}_by_kind", {}).items():
                    kinds[kind] = kinds.get(kind, 0) + n
            total = sum(r["stored_bytes"] for r in rows[1:])
            out[k]["upload_by_kind_over_stored"] = {kind: round(n / total, 3) for kind, n in sorted(kinds.items())}
    checks = [r for r in rows if "checkout_tip_s" in r]
    out["checkout_tip_over_first"] = [round(r["checkout_tip_s"] / r["checkout_first_s"], 2) for r in checks]
    out["load_tip_over_first"] = [round(r["load_tip_s"] / r["load_first_s"], 2) for r in checks if "load_tip_s" in r]
    out["tip_depth_max"] = max(r["tip_depth"] for r in rows)
    out["trl_total_over_stored"] = sum(r.get("trl_bytes", 0) for r in rows) / sum(r["stored_bytes"] for r in rows[1:])
    out["trl_anchored_total_over_stored"] = sum(r.get("trl_anchored_bytes", 0) for r in rows) / \
        sum(r["stored_bytes"] for r in rows[1:])
    out["prune"] = prune
    out["prune_freed_fraction"] = prune["bytes_freed"] / prune["bytes_before"] if prune["bytes_before"] else 0
    return out


def markdown(summaries: list[dict]) -> str:
    lines = ["| run | steps | exact | remote | follower median KB | max / median | mean / median | steps > 2x median "
             "| stored mean / follower median | upload / stored | server-side copies / stored | follower / stored "
             "| push s first / last 100 "
             "| follow s first / last 100 | tip depth max | tip checkout / step 0 (max; median) "
             "| tip load / step 0 (max; median) | TRL 6 B / stored "
             "| TRL + anchor / 20 / stored | prune every 100 + last 10 frees |",
             "|" + "---|" * 20]
    for s in summaries:
        for k in ("dir", "hub", "bucket", "s3"):
            if k not in s:
                continue
            r = s[k]
            lines.append(
                f"| {s['run']} | {s['steps']} | {s['all_exact']} | {k} | {r['follower_median'] / 1e3:.1f} "
                f"| {r['follower_max_over_median']:.2f} | {r['follower_mean_over_median']:.2f} | {r['steps_over_2x_median']} "
                f"| {r['stored_mean_over_follower_median']:.2f} | {r['upload_over_stored']:.2f} "
                f"| {r.get('copied_over_stored', 0):.2f} | {r['follower_over_stored']:.2f} "
                f"| {r['push_s_first100_median']:.3f} / {r['push_s_last100_median']:.3f} "
                f"| {r['follow_s_first100_median']:.3f} / {r['follow_s_last100_median']:.3f} | {s['tip_depth_max']} "
                f"| {_max_median(s['checkout_tip_over_first'])} | {_max_median(s.get('load_tip_over_first', []))} "
                f"| {s['trl_total_over_stored']:.2f} "
                f"| {s['trl_anchored_total_over_stored']:.2f} | {100 * s['prune_freed_fraction']:.0f}% |")
    for s in summaries:
        for k in SERVED:
            if "upload_by_kind_over_stored" in s.get(k, {}):
                kinds = ", ".join(f"{kind} {v:.3f}" for kind, v in s[k]["upload_by_kind_over_stored"].items())
                lines.append(f"\n{s['run']}, {k}: uploads by kind, over stored (as the server received them): {kinds}")
    return "\n".join(lines)


def _max_median(xs) -> str:
    return f"{max(xs):.2f}; {median(xs):.2f}" if xs else "n/a"


def plot(results: dict, out: Path) -> None:
    """Per-step follower bytes (directory remote), stored bytes and TRL's 6-byte sparse bytes, one
    panel a run, log scale; an SVG drawn here, converted to PNG with cairosvg."""
    import math

    panels = [(name, res["rows"]) for name, res in results.items()]
    w, h, pad = 900, 260, 50
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h * len(panels)}" '
             f'font-family="sans-serif" font-size="11"><rect width="100%" height="100%" fill="white"/>']
    series = [("follow_dir_bytes", "#1f77b4", "follower (directory remote)"), ("stored_bytes", "#2ca02c", "stored"),
              ("trl_bytes", "#d62728", "TRL sparse (6 B / changed element)")]
    for i, (name, rows) in enumerate(panels):
        y0 = i * h
        vals = [r.get(k) for r in rows[1:] for k, _, _ in series if r.get(k)]
        lo, hi = math.log10(max(1, min(vals))), math.log10(max(vals))
        hi = hi if hi > lo else lo + 1
        n = max(1, len(rows) - 1)

        def xy(step, v):
            x = pad + (w - 2 * pad) * step / n
            y = y0 + h - pad + 10 - (h - pad - 10) * (math.log10(max(1, v)) - lo) / (hi - lo)
            return f"{x:.1f},{y:.1f}"

        parts.append(f'<text x="{pad}" y="{y0 + 16}" font-size="13">{name}: bytes per step (log scale)</text>')
        for e in range(math.floor(lo), math.ceil(hi) + 1):
            if lo <= e <= hi:
                y = xy(0, 10 ** e).split(",")[1]
                parts.append(f'<line x1="{pad}" x2="{w - pad}" y1="{y}" y2="{y}" stroke="#ddd"/>'
                             f'<text x="4" y="{y}">{10 ** e:.0e}</text>')
        for j, (key, colour, label) in enumerate(series):
            pts = " ".join(xy(r["step"], r[key]) for r in rows[1:] if r.get(key))
            parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1" points="{pts}"/>')
            parts.append(f'<text x="{pad + 10}" y="{y0 + h - 58 + 13 * j}" fill="{colour}">{label}</text>')
        parts.append(f'<text x="{w - pad - 30}" y="{y0 + h - 8}">step {n}</text>')
    parts.append("</svg>")
    import cairosvg

    cairosvg.svg2png(bytestring="".join(parts).encode(), write_to=str(out))


def write_results(out: Path, summaries, results, calibration) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"summaries": summaries, "runs": results}, indent=1))
    md = markdown(summaries)
    out.with_suffix(".md").write_text(
        "# Long runs (`python -m benchmarks.long_run`)\n\n" + md + "\n\nCalibration of the synthetic run: "
        + json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in calibration.items()
                      if k != "ulp_distribution"}) + "\n")
    plot(results, out.with_suffix(".png"))
    print(md)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--real-steps", type=int, default=400)
    ap.add_argument("--synthetic-steps", type=int, default=5000)
    ap.add_argument("--synthetic-mb", type=float, default=8.0)
    ap.add_argument("--checkout-every", type=int, default=100)
    ap.add_argument("--max-minutes", type=float, default=None,
                    help="stop the synthetic run after this long (the steps done are measured and reported)")
    ap.add_argument("--calibrate-steps", type=int, default=0,
                    help="with --real-steps 0: measure this many steps of the real run (uncommitted) to calibrate")
    ap.add_argument("--calibration", type=Path, default=None, metavar="JSON",
                    help="the synthetic run's calibration from an earlier invocation's results (its real run's)")
    ap.add_argument("--hub", action="store_true", help="also push to and follow the local Hub server")
    ap.add_argument("--bucket", action="store_true", help="also push to and follow a Storage Bucket on the local Hub server")
    ap.add_argument("--s3", action="store_true", help="also push to and follow an S3 remote (moto's server on 127.0.0.1)")
    ap.add_argument("--publisher", action="store_true",
                    help="commit and push through wvc.Publisher (what the Trainer callback runs), directory remote only")
    ap.add_argument("--step-coder", choices=["chosen", "STEP_RUNS", "STEP_BLOCKS", "ULP_STEP"], default="chosen",
                    help="the step coder commits write (chosen: STEP_RUNS or STEP_BLOCKS by the step, what wvc "
                         "writes; ULP_STEP, STEP_BLOCKS: what it wrote before, for an A/B)")
    ap.add_argument("--out", type=Path, default=RESULTS / "long_run.json")
    ap.add_argument("--merge", type=Path, nargs="+", default=None, metavar="JSON",
                    help="only combine results of earlier invocations (e.g. the runs made in parallel) into --out")
    args = ap.parse_args(argv)
    from wvc.codec import Method, transforms

    transforms.STEP_CODER = None if args.step_coder == "chosen" else Method[args.step_coder]
    if args.hub and args.bucket:  # (as the Hub's does: uploads to the bucket would be counted as near nothing)
        ap.error("--hub and --bucket share the local server's Xet service, which deduplicates one's uploads against "
                 "the other's: run them in separate invocations (--merge combines the results)")
    if args.publisher and (args.hub or args.bucket or args.s3):
        ap.error("--publisher pushes to the directory remote only (to the Hub it pushes once a minute, not a step)")
    if args.merge:
        summaries, results, calibration = [], {}, {}
        for path in args.merge:
            data = json.loads(path.read_text())
            summaries += data["summaries"]
            results.update(data["runs"])
            calibration = next((r["calibration"] for r in data["runs"].values() if "calibration" in r), calibration)
        write_results(args.out, summaries, results, calibration)
        return
    work = Path(tempfile.mkdtemp(prefix="wvc-long-run-"))
    server = s3 = None
    try:
        if args.s3:
            s3, s3_bucket = start_s3(work)
        if args.hub or args.bucket:
            import os

            from wvc.testing.hub import HubServer

            server = HubServer(work / "hub").start()
            os.environ["HF_ENDPOINT"] = server.base_url
            os.environ.setdefault("HF_TOKEN", "bench")
            os.environ["HF_HUB_CACHE"] = str(work / "hf-cache")
            os.environ["HF_XET_CACHE"] = str(work / "xet-cache")
        results, summaries = {}, []
        remotes = ["dir"] + [r for r in ("hub", "bucket", "s3") if getattr(args, r)]

        def urls(name):
            return {"hub_url": f"hf://bench/long-{name}" if args.hub else None,
                    "bucket_url": f"hf://buckets/bench/long-{name}" if args.bucket else None,
                    "s3_url": f"s3://{s3_bucket}/long-{name}" if args.s3 else None}
        cal = Calibration()
        if args.real_steps:
            rows, prune = run("real", real_steps(args.real_steps), work, **urls("real"),
                              checkout_every=args.checkout_every, calibrate=cal, server=server, publisher=args.publisher)
            results["real"] = {"rows": rows, "prune": prune, "calibration": cal.to_json()}
            summaries.append(summarize("real", rows, prune, remotes))
        if args.calibrate_steps and not cal.fractions:  # the real run's steps, measured without committing them
            prev = prev_delta = None
            for step, state in real_steps(args.calibrate_steps):
                cur = torch.cat([state[k].detach().reshape(-1).view(torch.int16) for k in sorted(state)]).clone()
                if prev is not None:
                    prev_delta = cal.add(prev, cur, prev_delta)
                prev = cur
        if args.calibration is not None and not cal.fractions:
            earlier = json.loads(args.calibration.read_text())["runs"]
            calibration = next(r["calibration"] for r in earlier.values() if "calibration" in r)
        elif cal.fractions:
            calibration = cal.to_json()
        else:
            calibration = {
                "changed_start": 0.061, "changed_end": 0.024, "p_again": 0.5, "p_same_sign": 0.8,
                "ulp_distribution": [0.0, 0.6, 0.25, 0.1] + [0.05 / 13] * 13}
        if args.synthetic_steps:
            rows, prune = run("synthetic", synthetic_steps(args.synthetic_steps, args.synthetic_mb, calibration), work,
                              **urls("synthetic"),
                              checkout_every=args.checkout_every * 5, calibrate=None, server=server,
                              deadline=time.monotonic() + 60 * args.max_minutes if args.max_minutes else None,
                              publisher=args.publisher)
            results["synthetic"] = {"rows": rows, "prune": prune, "calibration": calibration}
            summaries.append(summarize("synthetic", rows, prune, remotes))
        write_results(args.out, summaries, results, calibration)
    finally:
        if server is not None:
            server.shutdown()
        if s3 is not None:
            s3.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
