"""``Publisher``: commit and push snapshots of live weights off the caller's thread.

    pub = Publisher("runs/wvc", branch="run/grpo", push_to="/shared/weights")
    for step in ...:
        optimizer.step()
        pub.publish(model.state_dict(), message=f"step {step}", metadata={"step": step})
    pub.close()

``publish`` holds the caller only while it copies the tensors (a consistent snapshot: the
model may change the moment it returns); hashing, encoding, committing and pushing run on
two background threads. The queue of snapshots waiting to be committed is bounded
(``max_pending``): when the publisher falls behind, a new snapshot replaces the newest one
still waiting, and the commit that lands records the steps it replaced in its metadata
(``skipped_steps``), so nothing is lost silently and memory stays at ``max_pending + 1``
snapshots. Pushes coalesce (pushing the tip sends every commit before it) and, to a Hub
remote, run at most once per ``push_interval`` seconds: the Hub has an hourly commit quota
per repository, a directory or object-storage remote has none.

Onto the branch the repository's HEAD is on, each commit is HEAD's new version and the
working tree is refreshed to it (worktree/refresh.py: the model file is written out after each
commit); a branch of its own (``run/<name>``, as the Trainer callback uses) writes nothing
but the repository.

Failures never reach the training loop: they are logged and collected in ``errors``; a
failed push is retried with back-off and at ``close``. huggingface_hub's own upload bars are
kept out of the training log while a push runs (``quiet_hub``; see hub_bars_silenced).

``keep`` (a retention policy, as ``wvc prune`` takes it: ``"last=10,every=100"``, a dict or
a KeepPolicy) prunes the branch as the run goes, every ``prune_every`` commits: the versions
the policy does not keep lose their weights (they stay in the log). With a remote, only
versions the remote already has are pruned (a push must still be able to send the others),
and never while a push is reading the store; ``prune_remote`` prunes the remote's copy
of the branch as well (``wvc prune --remote``; on the Hub, one commit each time).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..api import Repo
from ..codec.pool import work_in_background
from ..remotes.urls import is_hub, local_path

log = logging.getLogger(__name__)

# Raw chunks of the last commit kept in memory as the next commit's delta bases (a step's
# chunks are deltas against the step before: decoding their chains instead made each
# commit slower than the last), and those of the commit before (the bases' own bases, which
# ULP_STEP codes a step's change against). Two more host copies of the weights, up to this
# much each.
KEEP_BYTES = 2 << 30

# A prune every few versions (keep=) rewrites a remote pack that keeps live chunks only once
# at least this share of it is dead: a rewrite copies the live bytes into a new pack and
# retires the old one for the grace period (remotes/compaction.py, an hour), so pruning every
# 5 syncs retired several times what it freed and the remote outgrew one keeping everything
# (issue 65: 1.14x over 20 syncs at 74M, one prune rewriting 8.6 MB to free 88 bytes).
# An explicit prune frees all it can.
PERIODIC_DEAD_SHARE = 0.5

# The Hub allows a bounded number of commits per repository and hour; one push a minute
# stays well inside it. Other remotes take every commit.
HUB_PUSH_INTERVAL = 60.0

# huggingface_hub draws its upload bars (a background push's, in the middle of a training
# log) in no group of their own: the only switch is its global one. A Publisher turns it off
# while one of its pushes runs and puts back exactly what was there (counted across
# publishers), so a training script's own bars are affected only during those seconds.
_BARS_LOCK = threading.Lock()
_bars_silenced = 0
_bars_saved: dict | None = None


@contextlib.contextmanager
def hub_bars_silenced(enabled: bool = True):
    global _bars_silenced, _bars_saved
    states = None
    if enabled:
        try:
            import importlib

            from huggingface_hub.utils import disable_progress_bars

            # the module (huggingface_hub.utils re-exports its tqdm class under the same name)
            states = getattr(importlib.import_module("huggingface_hub.utils.tqdm"), "progress_bar_states", None)
        except ImportError:
            states = None
    if states is None:
        yield
        return
    with _BARS_LOCK:
        if _bars_silenced == 0:
            _bars_saved = dict(states)
            disable_progress_bars()
        _bars_silenced += 1
    try:
        yield
    finally:
        with _BARS_LOCK:
            _bars_silenced -= 1
            if _bars_silenced == 0:
                states.clear()
                states.update(_bars_saved or {})


def snapshot_state_dict(state_dict: Mapping, frozen: frozenset[str] = frozenset(), alloc=None) -> dict:
    """A consistent host copy of ``state_dict``: each tensor storage copied once, so
    tensors that shared memory (tied embeddings) still share it, which is how transformers
    recognises tied weights when it saves. Names in ``frozen`` (parameters that do not
    train, a PEFT model's base) are referenced, not copied. ``alloc(nbytes)`` gives the
    host storages (default: new ones)."""
    import torch

    alloc = alloc or (lambda n: torch.UntypedStorage(n, device="cpu"))

    copies: dict = {}
    out = {}
    for name, t in state_dict.items():
        if not isinstance(t, torch.Tensor) or t.device.type == "meta":
            out[name] = t
            continue
        t = t.detach()
        if name in frozen:
            out[name] = t
            continue
        storage = t.untyped_storage()
        key = (str(t.device), storage.data_ptr(), storage.nbytes())
        copy = copies.get(key)
        if copy is None:
            copy = copies[key] = alloc(storage.nbytes())
            copy.copy_(storage)
        out[name] = torch.empty(0, dtype=t.dtype).set_(copy, t.storage_offset(), t.size(), t.stride())
    return out


def push_wait(now: float, last_try: float, attempts: int, interval: float, retry_seconds: float,
              flushing: bool) -> float:
    """Seconds the pusher waits before its next push (0 or less: push now). After a
    failure: the back-off, retry_seconds * 2**(attempts-1), at most 60 s, flush or not (a
    flush must not hammer a failing remote). Otherwise: what is left of ``interval`` since
    the last push, unless someone is flushing."""
    if attempts:
        return last_try + min(60.0, retry_seconds * 2.0 ** (attempts - 1)) - now
    if flushing:
        return 0.0
    return last_try + interval - now


class SnapshotBuffers:
    """Host storages of committed snapshots, reused for the next ones. A fresh allocation
    is touched page by page during the copy: into a reused buffer the snapshot of a 512 MB
    tensor took 0.057 s instead of 0.14-0.18 s here, and the snapshot is the training pause.
    Keeps at most ``sets`` snapshots' worth of bytes (the publisher's snapshots in flight)."""

    def __init__(self, sets: int):
        self.sets = sets
        self.free: dict[int, list] = {}
        self.free_bytes = 0
        self.set_bytes = 0  # the largest snapshot given back
        self.lock = threading.Lock()

    def take(self, nbytes: int, taken: list):
        import torch

        with self.lock:
            stack = self.free.get(nbytes)
            buf = stack.pop() if stack else None
            if buf is not None:
                self.free_bytes -= nbytes
        if buf is None:
            buf = torch.UntypedStorage(nbytes, device="cpu")
        taken.append(buf)
        return buf

    def give(self, buffers: list) -> None:
        with self.lock:
            self.set_bytes = max(self.set_bytes, sum(b.nbytes() for b in buffers))
            for buf in buffers:
                if self.free_bytes + buf.nbytes() <= self.sets * self.set_bytes:
                    self.free.setdefault(buf.nbytes(), []).append(buf)
                    self.free_bytes += buf.nbytes()


@dataclass
class Job:
    """One snapshot to commit: a state dict committed as one file onto the branch's tree,
    or ``write_files(snapshot, directory)`` writing the whole version into a directory."""
    message: str
    metadata: dict
    snapshot: Mapping | None = None
    write_files: Callable[[Mapping, Path], None] | None = None
    directory: Path | None = None  # an existing directory to commit (a Trainer checkpoint)
    exclude: tuple[str, ...] = ()
    skipped: list = field(default_factory=list)  # steps this job replaced in the queue
    buffers: list = field(default_factory=list)  # SnapshotBuffers storages the snapshot lives in
    done: threading.Event = field(default_factory=threading.Event)
    commit: str | None = None
    error: str | None = None


class Publisher:
    """Commits (and pushes) snapshots of live weights off the training thread; see the module
    docstring. ``publish`` copies and queues, ``flush`` waits, ``close`` finishes and pushes."""

    def __init__(self, repo_path, branch: str, *, push_to: str | None = None, remote: str = "origin",
                 max_pending: int = 1, push_interval: float | None = None, device: str = "auto",
                 max_push_attempts: int = 5, retry_seconds: float = 2.0, keep_bytes: int = KEEP_BYTES,
                 quiet_hub: bool = True, keep=None, prune_every: int | None = None, prune_remote: bool = False):
        if max_pending < 1:
            raise ValueError("max_pending must be at least 1")
        from ..model.keep_policy import KeepPolicy

        self.keep = KeepPolicy.of(keep) if keep is not None else None  # (a bad policy fails here, not mid-run)
        # pruning batches: one pass re-encodes what the kept versions need once, not every step
        self.prune_every = prune_every or max(1, min(16, (self.keep.last if self.keep and self.keep.last else 16)))
        self._commits_unpruned = 0
        self.prune_remote = prune_remote and bool(push_to)  # the remote's copy of the branch too (a Hub commit each)
        self._store_lock = threading.Lock()  # a prune and a push never overlap
        self.prunes: list[dict] = []  # one per prune: pruned, bytes_freed, seconds
        self.repo_path = Path(repo_path)
        self.branch = branch
        self.remote = remote
        self.device = device
        self.max_pending = max_pending
        self.keep_bytes = keep_bytes
        self.quiet_hub = quiet_hub  # huggingface_hub's upload bars kept out of the training log
        self.max_push_attempts = max_push_attempts
        self.retry_seconds = retry_seconds  # back-off base: retry_seconds * 2**(attempt-1), at most 60 s
        self.commits: list[dict] = []  # one per commit: commit, step, skipped_steps, seconds, bytes
        self.pushes: list[dict] = []  # one per push that landed: commit, commits, seconds, uploaded bytes, files replaced
        self.errors: list[str] = []
        self.unpushed = False
        repo = Repo.open(self.repo_path) if (self.repo_path / ".wvc").is_dir() else Repo.init(self.repo_path)
        if push_to and local_path(push_to) is not None:
            # a directory given here is relative to the caller, as repo_path is (a remote added
            # to the repository is relative to its root: the Publisher pushed into its own folder)
            push_to = str(Path(local_path(push_to)).expanduser().resolve())
        self.push_to = push_to
        if push_to and remote not in repo.remotes():
            repo.remote_add(remote, push_to)
        repo.close()
        if push_interval is None:
            # a Hub repo's commits are under an hourly quota; a bucket has no commits: every step
            hub_repo = is_hub(push_to or "")
            push_interval = HUB_PUSH_INTERVAL if hub_repo else 0.0
        self.push_interval = push_interval
        self.buffers = SnapshotBuffers(sets=max_pending + 1)
        self._cond = threading.Condition()
        self._pending: list[Job] = []
        # the state both threads and the caller share, under _cond
        self._closing = False
        self._push_wanted = False  # a commit landed that no push has sent yet
        self._busy = False  # the committer is working on a job
        self._committer_failed = False  # it could not open the repository: nothing will be committed
        self._pushing = False  # the pusher is pushing
        self._flush_requested = False  # someone waits in flush: push without waiting out push_interval
        self._writer = None  # the committer's Repo, once it opened the repository
        self._committer = threading.Thread(target=self._commit_loop, name="wvc-commit", daemon=True)
        self._committer.start()
        self._pusher = None
        if push_to:
            self._pusher = threading.Thread(target=self._push_loop, name="wvc-push", daemon=True)
            self._pusher.start()

    # -- the caller's side ---------------------------------------------------------------------
    def publish(self, state_dict: Mapping | None = None, *, message: str, metadata: dict | None = None,
                frozen: frozenset[str] = frozenset(), write_files=None, directory=None, exclude=(),
                wait: bool = False, snapshot: tuple[Mapping, list] | None = None) -> Job:
        """Snapshot ``state_dict`` (unless ``snapshot`` is one :meth:`snapshot` took) and
        queue its commit; ``wait`` blocks until it is committed (a checkpoint directory that
        the Trainer may delete later is committed before training goes on)."""
        snapshot, buffers = snapshot or (None, [])
        if snapshot is None and state_dict is not None:
            snapshot, buffers = self.snapshot(state_dict, frozen)
        job = Job(message, dict(metadata or {}), snapshot, write_files,
                  Path(directory) if directory is not None else None, tuple(exclude), buffers=buffers)
        with self._cond:
            if self._closing or self._committer_failed:
                self.buffers.give(buffers)
                raise RuntimeError("the publisher is closed" if self._closing else self.errors[-1])
            # Only a snapshot may be replaced: a directory is committed as it is now or never.
            replaceable = [j for j in self._pending if j.directory is None]
            if len(self._pending) >= self.max_pending and replaceable and job.directory is None:
                dropped = replaceable[-1]
                self._pending.remove(dropped)
                job.skipped = dropped.skipped + [dropped.metadata.get("step", dropped.message)]
                dropped.error = "replaced by a newer snapshot"
                dropped.snapshot = None
                self.buffers.give(dropped.buffers)
                dropped.done.set()
            self._pending.append(job)
            self._cond.notify_all()
        if wait:
            job.done.wait()
        return job

    def snapshot(self, state_dict: Mapping, frozen: frozenset[str] = frozenset()) -> tuple[dict, list]:
        """A host copy of ``state_dict`` in reused buffers, for a later ``publish(snapshot=...)``."""
        buffers: list = []
        return snapshot_state_dict(state_dict, frozen, alloc=lambda n: self.buffers.take(n, buffers)), buffers

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued snapshot is committed and (with a remote) pushed; False
        when ``timeout`` ran out first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._flush_requested = True
            self._cond.notify_all()
            try:
                while self._pending or self._busy or self._push_wanted or self._pushing:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        return False
                    self._cond.wait(timeout=left)
            finally:
                self._flush_requested = False
        return True

    def close(self, timeout: float | None = 30.0) -> bool:
        """Flush (bounded by ``timeout``) and stop the threads. What is left unpushed is
        reported in ``errors`` and stays committed: ``wvc push`` sends it later."""
        done = self.flush(timeout) and not self.unpushed
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self.keep is not None and self._commits_unpruned and done:
            self._committer.join()  # (idle after the flush: it returns now)
            repo = Repo.open(self.repo_path)
            try:
                self._prune(repo, wait=True)  # the last versions follow the policy too
            finally:
                repo.close()
        if not done:
            self.unpushed = True
            message = (f"not committed and pushed within {timeout:g} s: what is committed of {self.branch} is in "
                       f"{self.repo_path}; `wvc push {self.remote} {self.branch}` there sends it")
            self.errors.append(message)
            log.warning("wvc: %s", message)
        return done

    # -- the committer -------------------------------------------------------------------------
    def _commit_loop(self) -> None:
        work_in_background()  # (training comes first where they share cores)
        try:
            repo = Repo.open(self.repo_path)  # its own connection: never shares the caller's
        except Exception as exc:  # noqa: BLE001 - reported; every waiting job fails with it
            self.errors.append(f"cannot open {self.repo_path}: {exc}")
            log.error("wvc: %s", self.errors[-1])
            with self._cond:
                self._committer_failed = True
                for job in self._pending:
                    job.error = self.errors[-1]
                    job.done.set()
                self._pending.clear()
                self._cond.notify_all()
            return
        repo.keep_recent_chunks(self.keep_bytes)
        self._writer = repo  # what the pusher reads the kept chunks of
        try:
            while True:
                with self._cond:
                    while not self._pending and not self._closing:
                        self._cond.wait()
                    if not self._pending:
                        return
                    job = self._pending.pop(0)
                    self._busy = True
                try:
                    self._commit(repo, job)
                finally:
                    # The buffers go back before the job counts as finished: a flush that
                    # returned while they were still out made the next snapshot allocate.
                    job.snapshot = None  # its buffers serve the next snapshots
                    self.buffers.give(job.buffers)
                    with self._cond:
                        self._busy = False
                        if job.commit is not None and self._pusher is not None:
                            self._push_wanted = True
                        self._cond.notify_all()
                    job.done.set()
        finally:
            repo.close()

    def _commit(self, repo, job: Job) -> None:
        t = time.perf_counter()
        metadata = dict(job.metadata)
        if job.skipped:
            metadata["skipped_steps"] = job.skipped
        try:
            with contextlib.ExitStack() as stack:
                if job.write_files is not None:
                    from ..fsutil import sweep_work_dirs, work_dir

                    sweep_work_dirs(repo.wvc_dir)
                    source = stack.enter_context(work_dir(repo.wvc_dir, "publish"))
                    job.write_files(job.snapshot, source)
                else:
                    source = job.directory if job.directory is not None else job.snapshot
                res = repo.commit(job.message, source=source, metadata=metadata, allow_empty=True,
                                  branch=self.branch, device=self.device, exclude=job.exclude)
        except Exception as exc:  # noqa: BLE001 - reported, never raised into training
            job.error = f"commit of {job.message!r} failed: {exc}"
            self.errors.append(job.error)
            log.error("wvc: %s", job.error)
            return
        job.commit = res.commit
        self.commits.append({"commit": res.commit, "step": job.metadata.get("step"), "skipped_steps": job.skipped,
                             "seconds": time.perf_counter() - t, "stored_bytes": res.stored_bytes,
                             "logical_bytes": res.logical_bytes})
        self._commits_unpruned += 1
        if self.keep is not None and self._commits_unpruned >= self.prune_every:
            self._prune(repo)

    def _prune(self, repo, wait: bool = False) -> None:
        """Apply ``keep`` to the branch; skipped (tried again after the next commit) while a
        push runs, unless ``wait``."""
        if not self._store_lock.acquire(blocking=wait):
            return
        t = time.perf_counter()
        try:
            protect: set[str] = set()
            if self._pusher is not None:  # what the remote lacks keeps its weights until pushed
                tip = repo.branch_tip(self.branch)
                pushed = repo.branch_tip(self.branch, remote=self.remote)
                stop = set(repo.ancestors(pushed)) if pushed else set()
                protect = set(repo.ancestors(tip, stop=stop)) if tip else set()
            res = repo.prune(self.branch, keep=self.keep, protect=protect)
            self._commits_unpruned = 0
            entry = {"pruned": res.pruned, "bytes_freed": res.bytes_freed, "seconds": time.perf_counter() - t}
            if self.prune_remote and repo.branch_tip(self.branch, remote=self.remote):
                there = repo.remote_prune(self.remote, self.branch, keep=self.keep, min_dead_share=PERIODIC_DEAD_SHARE)
                entry.update(remote_pruned=there.pruned, remote_bytes_freed=there.bytes_freed,
                             seconds=time.perf_counter() - t)
            self.prunes.append(entry)
        except Exception as exc:  # noqa: BLE001 - reported, never raised into training
            self.errors.append(f"prune failed: {exc}")
            log.error("wvc: prune of %s failed: %s", self.branch, exc)
        finally:
            self._store_lock.release()

    # -- the pusher ----------------------------------------------------------------------------
    def _push_loop(self) -> None:
        work_in_background()
        repo = Repo.open(self.repo_path)
        attempts, last_try = 0, float("-inf")
        try:
            while True:
                with self._cond:
                    while True:
                        if not self._push_wanted:
                            if self._closing:
                                return
                            self._cond.wait()
                            continue
                        # Rate (push_wait): collect the commits that land meanwhile; a
                        # flush pushes once the committer is done, one push for it all.
                        flushing = (self._flush_requested or self._closing) and not self._pending and not self._busy
                        left = push_wait(time.monotonic(), last_try, attempts, self.push_interval,
                                         self.retry_seconds, flushing)
                        if left <= 0:
                            break
                        self._cond.wait(timeout=left)
                    self._push_wanted, self._pushing = False, True
                last_try = time.monotonic()
                try:
                    t = time.perf_counter()
                    if self._writer is not None:
                        # the step records take the payloads the commit coded (remotes/step_record_writer.py)
                        repo.share_kept_chunks(self._writer)
                    with hub_bars_silenced(self.quiet_hub), self._store_lock:
                        pushed = repo.push(self.remote, self.branch)
                    self.pushes.append({"commit": pushed.new, "commits": pushed.commits,
                                        "seconds": time.perf_counter() - t, "uploaded_bytes": pushed.uploaded_bytes,
                                        "files_replaced": pushed.files_replaced})
                    attempts = 0
                except Exception as exc:  # noqa: BLE001 - retried with back-off, never raised into training
                    attempts += 1
                    self.errors.append(f"push attempt {attempts}: {exc}")
                    log.warning("wvc: push to %s failed (%s); will retry", self.remote, exc)
                    with self._cond:
                        self._push_wanted = True
                        if self._closing and attempts >= self.max_push_attempts:
                            log.error("wvc: giving up pushing %s after %d attempts", self.branch, attempts)
                            self._push_wanted = False
                            self.unpushed = True
                finally:
                    with self._cond:
                        self._pushing = False
                        self._cond.notify_all()
        finally:
            repo.close()
