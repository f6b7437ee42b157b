"""Device names a user may give (``--device``, ``device=``), checked before any work.

``auto`` is cuda when a GPU is usable, else cpu. torch is imported only to ask about a GPU,
and not at all on a machine without an NVIDIA driver.
"""

from __future__ import annotations

import os
import re

from ..errors import DeviceUnavailable, InvalidArgument

_CUDA = re.compile(r"cuda(:\d{1,3})?")


def _cuda_usable() -> bool:
    if not os.path.exists("/proc/driver/nvidia/version"):  # no NVIDIA driver: no CUDA
        return False
    import torch

    return torch.cuda.is_available()


def resolve_device(device: str, *, allow_test_backend: bool = True) -> str:
    """``auto``, ``cpu``, ``cuda`` or ``cuda:N`` -> the device to use; a wrong name is an
    InvalidArgument, a GPU asked for where none is usable a DeviceUnavailable."""
    names = ("auto", "cpu", "torch-cpu") if allow_test_backend else ("auto", "cpu")
    if not isinstance(device, str) or not (device in names or _CUDA.fullmatch(device)):
        raise InvalidArgument(f"device must be auto, cpu, cuda or cuda:N, not {device!r}")
    if device == "auto":
        return "cuda" if _cuda_usable() else "cpu"
    if device.startswith("cuda"):
        if not _cuda_usable():
            raise DeviceUnavailable(f"device {device!r} asked for, but torch sees no usable CUDA GPU here")
        import torch

        index = int(device.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            raise DeviceUnavailable(f"device {device!r} asked for, but this machine has "
                                    f"{torch.cuda.device_count()} CUDA device(s)")
    return device
