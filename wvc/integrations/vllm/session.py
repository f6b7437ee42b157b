"""One vLLM worker following a wvc branch: a follower's host copy, and the engine it feeds.

The follower (wvc/read/follower.py) keeps the version in checkpoint form in host memory: one
copy of the model's checkpoint bytes beside the engine's own weights (on a GPU the engine's
are in device memory; on the CPU backend that is a second copy in RAM). Each update is
fetched and verified whole into that copy first (a failure there leaves the copy and the
engine on the old version), then sent into the engine (engine_weights.py). A failure while
the engine is being written cannot be undone (vLLM keeps no copy to roll back to, and a
failed partial reload was seen to poison later outputs), so the session is then marked
unusable with the reason: every later update refuses, and the engine must be restarted.

A server fetches while it serves (issue 65): ``prefetch`` moves the host copy to the next
version in a thread of its own while the engine goes on generating (the engine never reads
the host copy), and the update that follows only writes what changed into the engine: the
engine is held for the write alone. The commit the engine reports is the one written into
it, not the one the host copy has reached.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from ...codec.pool import work_in_background
from ...errors import EngineUnusable, InvalidArgument
from ...read.follower import Follower

log = logging.getLogger(__name__)


def _checkpoint_files(model: str, revision: str | None = None) -> list[Path]:
    """The safetensors files the engine was started from (a directory, or a Hub model already
    in the local cache: nothing is downloaded)."""
    root = Path(model)
    if not root.is_dir():
        try:
            from huggingface_hub import snapshot_download

            root = Path(snapshot_download(model, revision=revision, allow_patterns=["*.safetensors"],
                                          local_files_only=True))
        except Exception as exc:
            raise InvalidArgument(f"commit= needs the files the engine was started from; {model} is not a "
                                  f"directory nor in the local Hub cache ({exc})") from None
    files = sorted(root.glob("*.safetensors"))
    if not files:
        raise InvalidArgument(f"commit= needs the engine's safetensors files; {root} has none")
    return files


def checkpoint_layout(model: str, revision: str | None = None) -> dict[str, tuple[str, tuple]]:
    """(dtype, shape) of each tensor of the files the engine was started from, read from
    their headers only (bounded, validated): what a version must hold to be loaded into it."""
    from ...formats.safetensors import read_header

    layout: dict[str, tuple[str, tuple]] = {}
    for path in _checkpoint_files(model, revision):
        with open(path, "rb") as fh:
            header = read_header(fh, path.stat().st_size, str(path))
        for t in header.tensors:
            layout.setdefault(t.name, (t.dtype.name, tuple(t.shape)))
    return layout


def fits(layout: dict[str, tuple[str, tuple]]):
    """A follower's ``accept``: a version must hold the engine's tensors, no other, each of
    the same dtype and shape; else it is refused before anything is fetched or allocated (a
    fresh engine would refuse it, and a version lacking a tensor would leave that tensor's
    old values in place)."""

    def some(names: list) -> str:
        return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")

    def accept(entries: dict) -> None:
        missing = sorted(layout.keys() - entries.keys())
        extra = sorted(entries.keys() - layout.keys())
        problems = [f"lacks {some(missing)}"] if missing else []
        if extra:
            problems.append(f"has tensors the engine does not ({some(extra)})")
        problems += [f"{n} is {entries[n].dtype} {tuple(entries[n].shape)}, the engine's {layout[n][0]} {layout[n][1]}"
                     for n in sorted(layout.keys() & entries.keys())
                     if (entries[n].dtype, tuple(entries[n].shape)) != layout[n]][:3]
        if problems:
            raise InvalidArgument("the version does not fit the engine's model (a fresh engine would refuse it): "
                                  + "; ".join(problems))

    return accept


def host_copy(model: str, revision: str | None = None) -> dict:
    """The engine's checkpoint tensors, read into host memory (the follower's copy)."""
    from safetensors.torch import load_file

    tensors: dict = {}
    for path in _checkpoint_files(model, revision):
        tensors.update(load_file(str(path)))
    return tensors


class EngineFollower:
    """A worker's follower of ``branch`` of ``source``, feeding ``weights`` (EngineWeights).
    ``at``: the commit the engine was started from (checked against its files); without
    it, the first update loads the whole version."""

    def __init__(self, make_weights, source: str, branch: str = "main", *, at: str | None = None,
                 model: str | None = None, revision: str | None = None):
        state_dict = accept = None
        if at is not None:
            if model is None:
                raise InvalidArgument("at= needs the model the engine was started from")
            state_dict = host_copy(model, revision)
        if model is not None:
            try:
                accept = fits(checkpoint_layout(model, revision))
            except InvalidArgument as exc:  # (files not on this machine: vLLM's own load checks what it can)
                log.warning("wvc: versions cannot be checked against the engine's files before loading: %s", exc)
        self.follower = Follower(source, branch, state_dict=state_dict, at=at, patches=True, accept=accept)
        if at is not None:
            self.follower._start_at()  # checked now: a wrong commit= fails at init, not at the first update
        self._make_weights = make_weights
        self._weights = None
        self.unusable: str | None = None
        self.last_applied = None
        self._held = self.follower.commit  # what the engine holds (the host copy may be ahead: _fetched)
        self._fetched = None  # the host copy's moves not yet written into the engine (one Update)
        self._prepared: dict = {}  # EngineWeights.prepare's for _fetched (set and cleared with it)
        self._fetching: threading.Thread | None = None
        self._fetch_failure: BaseException | None = None
        self._host = threading.Lock()  # the host copy: one fetch or one write at a time

    @property
    def commit(self) -> str | None:
        """The commit the engine holds (None before the first update, without at=)."""
        return None if self.unusable else self._held

    def prefetch(self, rev: str | None = None) -> None:
        """Start fetching ``rev`` (default: the branch's tip) into the host copy, in a thread,
        and return: the engine serves meanwhile, and the next ``update`` only writes. A
        prefetch still running is left to finish (``update`` waits for it)."""
        if self.unusable is not None or self.prefetching:
            return
        self._fetching = threading.Thread(target=self._fetch, args=(rev, None), name="wvc-prefetch", daemon=True)
        self._fetching.start()

    @property
    def prefetching(self) -> bool:
        return self._fetching is not None and self._fetching.is_alive()

    def _fetch(self, rev: str | None, timeout: float | None) -> None:
        if threading.current_thread() is self._fetching:
            work_in_background()  # a prefetch: the engine's generation comes first where they share cores
        try:
            with self._host:
                up = self.follower.update(rev, timeout)  # all of it fetched and verified, or nothing changed
                if up is not None:
                    self._fetched = up if self._fetched is None else _combined(self._fetched, up)
                    self._prepared = self._prepare(self._fetched)
        except BaseException as exc:  # noqa: BLE001 - the update's error, raised where it is waited for
            self._fetch_failure = exc

    def _prepare(self, up) -> dict:
        """What the write of ``up`` can be spared (EngineWeights.prepare); a failure costs
        only that (the write then does it)."""
        try:
            return self._engine(self.follower.state_dict).prepare(self.follower.state_dict, up.changed)
        except Exception as exc:  # noqa: BLE001 - an optimisation: never the update's error
            log.debug("wvc: nothing prepared for the write (%s)", exc)
            return {}

    def _raise_fetch_failure(self) -> None:
        failure, self._fetch_failure = self._fetch_failure, None
        if failure is not None:
            raise failure

    def _engine(self, names):
        if self._weights is None:
            self._weights = self._make_weights(names)
        return self._weights

    def update(self, rev: str | None = None, timeout: float | None = None):
        """Move the engine to ``rev`` (default: the branch's tip); the follower's Update, or
        None when the engine holds it already."""
        if self.unusable is not None:
            raise EngineUnusable(f"this engine must be restarted: {self.unusable}")
        prefetched = self._fetching is not None
        if prefetched:
            self._fetching.join()
            self._fetching = None
            self._raise_fetch_failure()
        if not prefetched or (rev is not None and rev != self.follower.commit):
            self._fetch(rev, timeout)
            self._raise_fetch_failure()
        up = self._fetched
        if up is None:
            return None
        try:
            with self._host:
                self.last_applied = self._engine(self.follower.state_dict).apply(self.follower.state_dict,
                                                                                 up.changed, up.patches,
                                                                                 self._prepared)
            self._fetched, self._held, self._prepared = None, up.commit, {}
        except BaseException as exc:
            self.unusable = (f"the update to {up.commit[:12]} failed while its weights were being written into "
                             f"the engine ({type(exc).__name__}: {exc}); it holds part of {str(up.parent)[:12]} "
                             f"and part of {up.commit[:12]}")
            log.error("wvc: %s", self.unusable)
            raise EngineUnusable(self.unusable) from exc
        return up

    def info(self) -> dict:
        return {"commit": self.commit, "branch": self.follower.branch, "source": self.follower.source,
                "unusable": self.unusable}


def _combined(first, then):
    """Two moves of the host copy, written into the engine as one: what either changed."""
    from dataclasses import replace

    from ...read.follower import _merge_patches

    patches = None
    if first.patches is not None and then.patches is not None:
        patches = dict(first.patches)
        _merge_patches(patches, then.patches)
    return replace(then, parent=first.parent, changed=sorted(set(first.changed) | set(then.changed)),
                   downloaded_bytes=first.downloaded_bytes + then.downloaded_bytes,
                   seconds=first.seconds + then.seconds, patches=patches)
