"""Copies between a torch device and the host, batched, pinned and off the compute stream.

One :class:`DeviceCopies` per operation (a commit, a load, a follower's update). On CUDA:

- device-to-host copies land in page-locked (pinned) host buffers, so they run as DMA at
  the link's speed and without the host thread waiting; host-to-device copies start from
  such buffers for the same reason;
- copies run on their own stream, ordered after the work queued so far on the compute
  stream (an event), so a batch's copy overlaps the next batch's kernels; a copy's
  ``wait`` returns when its event has fired, and the buffers are recorded on the streams
  that use them, so torch's caching allocators never hand one out while a copy still runs;
- many small tensors travel as one copy of their concatenation (a copy costs ~10 us of
  launch and setup whatever its size; a model has hundreds of 1-100 KB tensors).

On the CPU (the ``torch-cpu`` test backend, and host tensors) every copy is done at once
and the same calls return at once: the batching and ordering logic is the same code, which
is what the tests exercise without a device.
"""

from __future__ import annotations

from .. import settings


def _batch_bytes() -> int:
    """How much one batch of a commit or load carries (WVC_DEVICE_BATCH_MB, 1-4096 MiB):
    large enough that a launch or a copy's fixed cost is lost in it, small enough that the
    batch's working copies (~5x its bytes on the device) fit beside a training job."""
    value = settings.text("WVC_DEVICE_BATCH_MB", "")
    return (int(value) if value.isdigit() and 1 <= int(value) <= 4096 else 256) << 20


BATCH_BYTES = _batch_bytes()


class DeviceCopies:
    def __init__(self, device, batch_bytes: int | None = None):
        import torch

        self.batch_bytes = batch_bytes or BATCH_BYTES
        self.torch = torch
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        if self.cuda and self.device.index is None:  # "cuda" is the current device: cuda:N, comparable
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.stream = torch.cuda.Stream(self.device) if self.cuda else None

    def _pinned(self, nbytes: int, dtype):
        t = self.torch
        return t.empty(nbytes // t.empty(0, dtype=dtype).element_size(), dtype=dtype, pin_memory=self.cuda)

    def to_host(self, tensor):
        """Start copying ``tensor`` (contiguous, on the device) to the host; returns ``wait()``
        -> the host copy as a numpy array (valid as long as it is referenced)."""
        t = self.torch
        if not self.cuda:
            host = tensor.contiguous()
            return lambda: host.numpy()
        host = self._pinned(tensor.numel() * tensor.element_size(), tensor.dtype).reshape(tensor.shape)
        done = t.cuda.Event()
        self.stream.wait_stream(t.cuda.current_stream(self.device))  # after the kernels that made it
        with t.cuda.stream(self.stream):
            host.copy_(tensor, non_blocking=True)
            done.record(self.stream)
        tensor.record_stream(self.stream)  # not reused by the allocator before the copy is done

        def wait():
            done.synchronize()
            return host.numpy()

        return wait

    def gather_to_host(self, tensors):
        """Start one copy of several device tensors' bytes (concatenated on the device);
        returns ``wait()`` -> a list of host uint8 arrays, one per tensor."""
        t = self.torch
        flats = [x.reshape(-1).view(t.uint8) for x in tensors]
        sizes = [f.numel() for f in flats]
        wait = self.to_host(flats[0] if len(flats) == 1 else t.cat(flats))

        def split():
            host, out, at = wait(), [], 0
            for n in sizes:
                out.append(host[at : at + n])
                at += n
            return out

        return split

    def staging(self, nbytes: int):
        """A host buffer (pinned on CUDA) of ``nbytes``, as a uint8 tensor, for the caller to
        fill (from several threads, each its own slice) before :meth:`upload`."""
        return self._pinned(nbytes, self.torch.uint8)

    def _staged(self, parts, align: int = 1, map=map):
        """``parts`` (host byte buffers) copied into one staging buffer, each at a multiple of
        ``align`` (by ``map``: a pool's, to copy side by side); returns it, the parts' starts
        and their sizes."""
        sizes = [len(memoryview(p).cast("B")) for p in parts]
        starts = [0]
        for n in sizes:
            starts.append(starts[-1] + -(-n // align) * align)
        staging = self.staging(starts[-1])
        host = staging.numpy()

        def place(k):
            host[starts[k] : starts[k] + sizes[k]] = memoryview(parts[k]).cast("B")

        for _ in map(place, range(len(parts))):
            pass
        return staging, starts, sizes

    def upload(self, staging):
        """One copy of a filled :meth:`staging` buffer to the device; returns the device
        tensor, usable on the current stream at once (it waits for the copy on the device)."""
        t = self.torch
        if not self.cuda:
            return staging
        flat = t.empty(staging.numel(), dtype=t.uint8, device=self.device)
        self.stream.wait_stream(t.cuda.current_stream(self.device))
        with t.cuda.stream(self.stream):
            flat.copy_(staging, non_blocking=True)
            done = t.cuda.Event()
            done.record(self.stream)
        t.cuda.current_stream(self.device).wait_event(done)
        flat.record_stream(self.stream)  # (torch keeps the pinned block until the copy's event)
        return flat

    def to_device(self, parts):
        """One copy of the host byte buffers ``parts`` to the device; returns their device
        uint8 tensors (views of one allocation), usable on the current stream at once. Each
        part starts 16-byte aligned, so that any dtype can view it."""
        staging, starts, sizes = self._staged(parts, align=16)
        flat = self.upload(staging)
        return [flat[at : at + n] for at, n in zip(starts, sizes)]

    def into(self, regions, parts, map=map) -> None:
        """Copy host byte buffers ``parts`` into device uint8 tensors ``regions`` (the same
        sizes): gathered into one pinned buffer (by ``map``: a pool's, to copy side by side),
        then a copy per region on the copy stream (no device buffer in between); the current
        stream waits for them on the device."""
        t = self.torch
        staging, starts, sizes = self._staged(parts, map=map)
        pieces = [(region, staging[at : at + n]) for region, at, n in zip(regions, starts, sizes)]
        if not self.cuda:
            for region, piece in pieces:
                region.copy_(piece)
            return
        self.stream.wait_stream(t.cuda.current_stream(self.device))  # after what used the regions
        with t.cuda.stream(self.stream):
            for region, piece in pieces:
                region.copy_(piece, non_blocking=True)
                region.record_stream(self.stream)
            done = t.cuda.Event()
            done.record(self.stream)
        t.cuda.current_stream(self.device).wait_event(done)
