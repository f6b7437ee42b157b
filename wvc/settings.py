"""Every environment variable wvc reads, read here and when it is used, never at import:
a test sets one with ``monkeypatch.setenv`` and the next call sees it, and nothing else in
the package touches ``os.environ`` (the CLI only sets defaults for the libraries it drives;
tests/test_architecture.py holds both). docs/reference/settings.md lists the ``WVC_*`` ones from
``VARIABLES``.

Three are read once, at import, because they size or choose something made once per
process: ``WVC_NO_NATIVE`` (whether the C kernels are loaded at all: codec/native.py,
codec/step_coder.py; both paths write the same bytes), ``WVC_CODEC_THREADS`` (the codec pool:
codec/pool.py) and ``WVC_DEVICE_BATCH_MB`` (codec/device_copy.py); ``VARIABLES`` says so of each.

A switch (``switch``) reads the same way everywhere: ``1``, ``true``, ``yes``, ``on`` turn it
on, ``0``, ``false``, ``no``, ``off`` turn it off, unset or empty leaves its default; anything
else is an error naming the variable (``WVC_NO_NATIVE=0`` once switched the kernels off).
"""

from __future__ import annotations

import os

# name -> what it does (docs/reference/settings.md's table); every WVC_* name the package reads is here
VARIABLES = {
    "WVC_AUTHOR": "author of new commits (default: user@host)",
    "WVC_DIR": "the repository the CLI works in (default: the current directory)",
    "WVC_DEBUG": "1: the CLI prints a traceback with an internal error",
    "WVC_CACHE": "where snapshot_download and followers cache versions (default: $HF_HOME/wvc)",
    "WVC_CODEC_THREADS": "threads that encode and decode chunks (1 to 64; default: the usable CPUs, at most 4); "
                         "read at import",
    "WVC_BACKGROUND_NICE": "nice steps below the process for work no one waits on: a trainer's background sync, "
                           "a server's fetch while it serves (0 to 19; default 10; 0: the same priority)",
    "WVC_DEVICE_BATCH_MB": "MiB one device batch of a commit or load carries (1 to 4096; default 256); read at import",
    "WVC_DIRECT_IO": "checkout writes with O_DIRECT: auto (default), 1 from 64 MiB, 0 never",
    "WVC_LOCK_TIMEOUT": "seconds to wait for another wvc process's lock (default 60)",
    "WVC_REFLOG_EXPIRE_DAYS": "days gc keeps commits only the reflog reaches (default 30; 0: none)",
    "WVC_HUB_MAX_WAIT": "seconds one Hub call may wait out rate limits (default 300)",
    "WVC_COMPACT_FANOUT": "segments a remote tier holds before a push merges them (default 4; 0: never compact)",
    "WVC_REMOTE_GRACE_SECONDS": "seconds a retired remote file is kept before a push deletes it (default 3600)",
    "WVC_BUCKET_STALE_SECONDS": "seconds after which a bucket push's unconfirmed ref update counts as crashed (default 30)",
    "WVC_MALLOC_TUNING": "0: leave glibc's malloc thresholds alone (default: raised at the first encode, codec/allocator.py)",
    "WVC_NO_NATIVE": "1: never load the C kernels (the numpy path; same bytes, slower); read at import",
    "WVC_NO_WHOLE_PAYLOADS": "1: encode and decode stream by stream, not whole payloads in C (same bytes)",
    "WVC_SYSTEM_ZSTD": "0: decode with the bundled zstd, never the system's libzstd (codec/native.py)",
    "WVC_VLLM_REMOTE": "the remote a vLLM server with the wvc backend follows (set by whoever starts it; required)",
    "WVC_VLLM_BRANCH": "the branch that server follows (default: the one init names, else main)",
    "WVC_VLLM_REPOSITORY": "a local clone of that remote whose chunks the server uses rather than downloads "
                           "(default: its --model directory where that is a clone's working tree)",
    "WVC_ALLOW_UNTESTED_VERSIONS": "1: use the vLLM and TRL integrations with versions they were not tested with "
                                   "(integrations/library_versions.py; default: refused, naming the supported range)",
}
# read as the libraries that own them do (huggingface_hub, XDG, boto3)
OTHERS = ("HF_ENDPOINT", "HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE", "XDG_CACHE_HOME", "AWS_RETRY_MODE",
          "AWS_MAX_ATTEMPTS", "VLLM_API_KEY")


def text(name: str, default: str | None = None) -> str | None:
    """The variable's value, or ``default`` when unset or empty."""
    if name not in VARIABLES and name not in OTHERS:
        raise KeyError(f"{name} is not a setting wvc reads: add it to wvc/settings.py")
    return os.environ.get(name) or default


ON = ("1", "true", "yes", "on")
OFF = ("0", "false", "no", "off")


def switch(name: str, default: bool = False) -> bool:
    """A switch: on (1, true, yes, on), off (0, false, no, off), or ``default`` when unset or
    empty; any other value is an error naming the variable."""
    from .errors import InvalidArgument

    value = text(name)
    if value is None:
        return default
    if value.strip().lower() in ON:
        return True
    if value.strip().lower() in OFF:
        return False
    raise InvalidArgument(f"{name}={value!r} is not a switch: 1 (or true, yes, on) or 0 (or false, no, off)")


def number(name: str, default: float) -> float:
    """A number; an unparseable value is an error naming the variable."""
    from .errors import InvalidArgument

    value = text(name)
    if value is None:
        return default
    try:
        return float(value)
    except ValueError as exc:
        raise InvalidArgument(f"{name}={value!r} is not a number") from exc


def is_set(name: str) -> bool:
    """Whether the variable is in the environment at all (even empty)."""
    text(name)  # (checks the name)
    return name in os.environ


def hf_offline() -> bool:
    """HF_HUB_OFFLINE as huggingface_hub reads it."""
    return (text("HF_HUB_OFFLINE") or "").upper() in ("1", "ON", "YES", "TRUE")
