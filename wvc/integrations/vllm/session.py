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

The workers of a tensor-parallel server share one follower (issue 65): the group's leader
(server_group.py) fetches into one host copy in shared memory (shared_host.py) and sends the
others what changed; each worker writes its own shard from that copy. One download, one decode
and one host copy a server, not a worker.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from ...codec.pool import work_in_background
from ... import settings
from ...errors import EngineUnusable, InvalidArgument, WvcError
from ...read.follower import Follower
from ...read.lent_chunks import LentChunks
from ...remotes.urls import local_repository
from . import server_group, shared_host
from .shared_names import REPOSITORY_ENV

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
    """The engine's checkpoint tensors, read into host memory of this process's own (the
    follower's copy): fresh tensors filled by plain reads (shared_host.read_checkpoint), not
    safetensors' ``load_file``, which maps the files privately and lazily, so that the first
    update faulted in and copied each page it wrote (a 494M server's first update 4.7 s
    against 1.1 s for the next)."""
    import torch

    tensors: dict = {}

    def fresh(t):
        if t.dtype.torch_name is None:
            raise InvalidArgument(f"tensor {t.name} is {t.dtype.name}, which torch has no type for")
        tensors[t.name] = torch.empty(t.shape, dtype=getattr(torch, t.dtype.torch_name))
        return tensors[t.name]

    for path in _checkpoint_files(model, revision):
        shared_host.read_checkpoint(path, fresh)
    return tensors


def lent_chunks(model: str | None) -> LentChunks | None:
    """The local clone whose chunks the follower uses rather than downloads (read/lent_chunks.py):
    the one ``WVC_VLLM_REPOSITORY`` names (an error if it is none), else the engine's ``--model``
    directory where it is a clone's working tree (a server started from ``wvc checkout``).
    Mid-run, a server started from one then reads one step, not the model, at its first update."""
    named = settings.text(REPOSITORY_ENV)
    if named:
        return LentChunks(named)
    found = local_repository(model) if model is not None else None
    if found is None:
        return None
    try:
        return LentChunks(found)
    except WvcError as exc:  # (its chunks are a shortcut: the server downloads what they would give)
        log.warning("wvc: the repository at %s is not used for its chunks: %s", found, exc)
        return None


class EngineFollower:
    """A worker's follower of ``branch`` of ``source``, feeding ``weights`` (EngineWeights).
    ``at``: the commit the engine was started from (checked against its files); without
    it, the first update loads the whole version. ``group``: the workers of the server
    this one shares a follower with (server_group.ServerGroup); every call is then made on
    all of them at once, as vLLM's ``collective_rpc`` does."""

    def __init__(self, make_weights, source: str, branch: str = "main", *, at: str | None = None,
                 model: str | None = None, revision: str | None = None, group=None):
        layout = accept = None
        if at is not None and model is None:
            raise InvalidArgument("at= needs the model the engine was started from")
        if model is not None:
            try:
                layout = checkpoint_layout(model, revision)
                accept = fits(layout)
            except InvalidArgument as exc:  # (files not on this machine: vLLM's own load checks what it can)
                log.warning("wvc: versions cannot be checked against the engine's files before loading: %s", exc)
        self.source, self.branch = str(source), branch
        # one host copy for the group, where its layout is known and every worker maps it
        self.shared = shared_host.allocate(layout, group) if group is not None and layout is not None else None
        self.group = group if self.shared is not None else None
        self.follower: Follower | None = None
        self._make_weights = make_weights
        self._weights = None
        self.unusable: str | None = None
        self.last_applied = None
        self._fetched = None  # the host copy's moves not yet written into the engine (one Update)
        self._prepared: dict = {}  # EngineWeights.prepare's for _fetched (set and cleared with it)
        self._fetching: threading.Thread | None = None
        self._fetch_failure: BaseException | None = None
        self._host = threading.Lock()  # the host copy: one fetch or one write at a time
        # a start the group agreed failed, on a worker that does not raise it (_failed): the
        # caller drops this session, as the last worker's caller never gets one
        self.failed: BaseException | None = None
        self._held: str | None = None  # what the engine holds (the host copy may be ahead: _fetched)
        failure = message = None
        if self.group is None or self.group.leads:
            try:
                self._start_follower(at, model, revision, accept)
                message = ("ok", self.follower.commit)
            except BaseException as exc:
                failure, message = exc, ("error", server_group.described(exc))
        if self.group is not None:
            message = self.group.broadcast(message)  # the others learn what the leader holds, or why it failed
        if failure is None and message[0] == "error":
            failure = server_group.rebuilt(message[1])
        if failure is not None:
            if self.group is None:
                raise failure
            self.failed = failure
            self._failed(failure)
            return
        self._held = message[1]

    def _start_follower(self, at, model, revision, accept) -> None:
        state_dict = None
        if self.shared is not None:
            state_dict = self.shared.tensors
            if at is not None:
                self.shared.fill(_checkpoint_files(model, revision))
        elif at is not None:
            state_dict = host_copy(model, revision)
        self.follower = Follower(self.source, self.branch, state_dict=state_dict, at=at, patches=True, accept=accept,
                                 repository=lent_chunks(model))
        if at is not None:
            self.follower._start_at()  # checked now: a wrong commit= fails at init, not at the first update

    @property
    def host(self) -> dict:
        """The host copy the engine is written from (shared with the group's other workers)."""
        return self.shared.tensors if self.follower is None else self.follower.state_dict

    @property
    def commit(self) -> str | None:
        """The commit the engine holds (None before the first update, without at=)."""
        return None if self.unusable else self._held

    def prefetch(self, rev: str | None = None) -> None:
        """Start fetching ``rev`` (default: the branch's tip) into the host copy, in a thread,
        and return: the engine serves meanwhile, and the next ``update`` only writes. A
        prefetch still running is left to finish (``update`` waits for it)."""
        if self.unusable is not None or self.prefetching or self.follower is None:
            return  # (a worker that shares its group's follower: the leader fetches)
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
        if self.group is not None:
            return self._update_together(rev, timeout)
        up = self._fetch_for_update(rev, timeout)
        if up is not None:
            self._write(up, self._prepared)
        return up

    def _fetch_for_update(self, rev, timeout):
        """The host copy's moves the engine has not had yet (waiting for a prefetch, or
        fetching now), or None."""
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
        return self._fetched

    def _update_together(self, rev, timeout):
        """``update`` on every worker of the group at once: the leader fetches and says what
        changed (or why it failed); each writes its shard; they agree on whether every write
        went in (a server with one shard written part way is unusable as a whole) before any
        returns, so the leader's next fetch never changes the copy under another's write."""
        failure = message = None
        if self.group.leads:
            try:
                message = ("update", self._fetch_for_update(rev, timeout))
            except BaseException as exc:
                failure, message = exc, ("error", server_group.described(exc))
        sent = self.group.broadcast(self._lighter(message) if self.group.leads else None)
        message = message if self.group.leads else sent
        if message[0] == "error":
            return self._failed(failure if failure is not None else server_group.rebuilt(message[1]))
        up = message[1]
        if up is None:
            return None
        problem = None
        try:
            if self.unusable is not None:
                raise EngineUnusable(f"this engine must be restarted: {self.unusable}")
            self._write(up, self._prepared if self.group.leads else {})
        except BaseException:
            problem = self.unusable or "its update failed"
        problems = [p for p in self.group.gather(problem) if p]
        if problems:
            self.unusable = self.unusable or f"a worker that shares its weights failed: {problems[0]}"
            return self._failed(EngineUnusable(f"this engine must be restarted: {self.unusable}"))
        return up

    def _lighter(self, message):
        """The update as the others are sent it: without the indices of tensors that every
        worker reloads whole (a packed module's: the indices go unused), which at an RL step
        are most of the model's changed elements (8 bytes each, pickled, while the engine is
        paused). The workers hold shards of one model: what this worker reloads whole, each does."""
        up = message[1] if message[0] == "update" else None
        if up is None or not up.patches:
            return message
        from dataclasses import replace

        try:
            engine = self._engine(self.host)
            patches = {name: idx for name, idx in up.patches.items() if not engine.reloaded_whole(name)}
        except Exception as exc:  # noqa: BLE001 - a saving only: the others must get a message whatever happens
            log.debug("wvc: every index sent (%s)", exc)
            return message
        return ("update", replace(up, patches=patches))

    def _failed(self, exc: BaseException):
        """A failure every worker of the group has agreed on, raised by the last worker alone:
        vLLM's ``collective_rpc`` stops reading replies at the first failed one and leaves the
        rest queued, so the next call would read this call's replies (two failed workers
        made every later call on the engine fail). The others return None."""
        if self.group.rank == self.group.size - 1:
            raise exc
        log.debug("wvc: %s (raised by the last worker)", exc)
        return None

    def _write(self, up, prepared) -> None:
        """Send ``up``'s changes from the host copy into the engine; a failure midway marks
        the engine unusable."""
        try:
            with self._host:
                self.last_applied = self._engine(self.host).apply(self.host, up.changed, up.patches, prepared)
            self._fetched, self._held, self._prepared = None, up.commit, {}
        except BaseException as exc:
            self.unusable = (f"the update to {up.commit[:12]} failed while its weights were being written into "
                             f"the engine ({type(exc).__name__}: {exc}); it holds part of {str(up.parent)[:12]} "
                             f"and part of {up.commit[:12]}")
            log.error("wvc: %s", self.unusable)
            raise EngineUnusable(self.unusable) from exc

    def info(self) -> dict:
        host = {"shared": self.shared is not None, "fetches": self.follower is not None,
                "name": None if self.shared is None else self.shared.name}
        return {"commit": self.commit, "branch": self.branch, "source": self.source, "unusable": self.unusable,
                "host_copy": host}


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
