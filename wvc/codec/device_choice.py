"""``device="auto"``: which codec path a commit takes, measured on this machine, not assumed.

Both paths write the same payloads; only their speed differs, and which is faster depends on
the machine (its cores against its GPU and link) and on where the data lives: tensors in
device memory must cross to the host for the C path, host bytes must cross to the device
for the device path. So the first commit of a process with ``auto`` on a machine with a
usable GPU times both paths, for the kind of source at hand, on a synthetic training step of that shape (16 MiB of bf16,
every element moved by about a learning rate: the dense case, where the transforms' cost
is largest), checks that they wrote the same bytes, and keeps the faster for the process.
Without a usable GPU ``auto`` is the C path, with nothing measured.
"""

from __future__ import annotations

import threading
import time

from .devices import resolve_device

_CHOSEN: dict[tuple[str, str], str] = {}
MEASURED: dict[tuple[str, str], dict[str, float]] = {}  # (device, source kind) -> path -> best seconds
_LOCK = threading.Lock()
TRIAL_BYTES = 16 << 20
TRIALS = 3  # the fastest of three runs of each path (the first pays for warm-up)


def data_location(source) -> str:
    """"device" for a state dict whose tensors are on a GPU, "host" for one in host memory,
    "files" for a directory (read chunk by chunk, each offered to the writer alone); a
    TensorStream says which of the first two it is."""
    if isinstance(getattr(source, "location", None), str):
        return source.location
    if not hasattr(source, "values"):
        return "files"
    return "device" if any(getattr(getattr(t, "device", None), "type", "cpu") == "cuda" for t in source.values()) \
        else "host"


def commit_device(requested: str, location: str = "files") -> str:
    """The device a commit's writer encodes on: ``requested`` itself unless it is ``auto``."""
    resolved = resolve_device(requested)
    if requested != "auto" or resolved == "cpu":
        return resolved
    with _LOCK:
        key = (resolved, location)
        if key not in _CHOSEN:
            seconds = MEASURED[key] = {}
            _CHOSEN[key] = fastest({resolved: _trial(resolved, location), "cpu": _trial("cpu", location)},
                                   seconds=seconds)
        return _CHOSEN[key]


def fastest(paths: dict, trials: int = TRIALS, clock=time.perf_counter, seconds: dict | None = None) -> str:
    """The name of the fastest of ``paths`` (name -> a function running it once, returning
    the payloads it wrote), each run ``trials`` times, interleaved; all must write the same
    payloads (else the C path's name, "cpu", is returned: the reference). ``seconds``, when
    given, gets each path's best time."""
    best = {} if seconds is None else seconds
    best.update(dict.fromkeys(paths, float("inf")))
    outputs = {}
    for _ in range(trials):
        for name, run in paths.items():
            t = clock()
            outputs[name] = run()
            best[name] = min(best[name], clock() - t)
    if len({tuple(out) for out in outputs.values()}) != 1:
        return "cpu"
    return min(best, key=best.__getitem__)


def _trial(device: str, location: str):
    """One run of a path on the synthetic step: a function returning its payloads."""
    import torch

    from ..formats.dtypes import DTYPES
    from .pool import pool
    from . import encode
    from .transforms import chosen_method

    bf16 = DTYPES["BF16"]
    g = torch.Generator().manual_seed(0)
    base = (torch.randn(TRIAL_BYTES // 2, generator=g) * 0.02).to(torch.bfloat16)
    new = (base.float() + torch.randn(base.shape, generator=g) * 2e-4).to(torch.bfloat16)  # most elements move
    chunk = 4 << 20
    host_new = new.view(torch.uint8).numpy()
    host_base = base.view(torch.uint8).numpy()
    spans = [(a, min(a + chunk, len(host_new))) for a in range(0, len(host_new), chunk)]
    gpu = device.startswith("cuda")
    where = torch.device(device if gpu else "cpu")
    source = new.to(where) if location == "device" and gpu else new

    if device == "cpu":
        def run():
            raw = source.view(torch.uint8).cpu().numpy()  # the C path reads host bytes
            return list(pool().map(lambda s: encode(raw[s[0]:s[1]], bf16, host_base[s[0]:s[1]]).payload, spans))
        return run

    if location == "files":  # files are read a chunk at a time: each chunk encoded on the device alone
        def run():
            return list(pool().map(lambda s: encode(host_new[s[0]:s[1]], bf16, host_base[s[0]:s[1]],
                                                    device=device).payload, spans))
        return run

    from .device_copy import DeviceCopies
    from .batched import DeviceChunk, encode_on_device

    def run():  # what TreeBuilder._device_tensors and ChunkWriter.put_device_batch do
        copies = DeviceCopies(where)
        if location == "device":
            flat = source.view(torch.uint8)
            copies.gather_to_host([flat[a:b] for a, b in spans])()  # down, to be hashed on the host
        else:
            flat = copies.to_device([host_new])[0]  # host tensors are hashed in place, and go up
        methods = list(pool().map(lambda s: chosen_method(host_new[s[0]:s[1]], bf16, host_base[s[0]:s[1]]), spans))
        on_device = [k for k, m in enumerate(methods) if m is not None]
        bases = copies.to_device([host_base[spans[k][0]:spans[k][1]] for k in on_device])
        futures = dict(zip(on_device, encode_on_device(
            [DeviceChunk(flat[spans[k][0]:spans[k][1]], b_dev, bf16, methods[k]) for k, b_dev in zip(on_device, bases)],
            level=1, submit=pool().submit, copy=copies.to_host)))
        return [futures[k].result().payload if k in futures else encode(host_new[a:b], bf16, host_base[a:b]).payload
                for k, (a, b) in enumerate(spans)]
    return run
