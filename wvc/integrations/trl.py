"""TRL's async GRPO syncs its vLLM servers through wvc: one argument to the trainer.

    from wvc.integrations.trl import WvcWeightTransfer

    trainer = AsyncGRPOTrainer(..., weight_transfer=WvcWeightTransfer(
        "hf://buckets/team/runs/grpo-1", servers=["http://vllm-0:8000"]))

Each server runs vLLM with the ``wvc`` weight-transfer backend (``--weight-transfer-config
'{"backend": "wvc"}'``, integrations/vllm/transfer.py). ``WvcWeightTransfer`` is TRL's
``WeightTransferProtocol`` (``init_weight_transfer``, ``pause``, ``send_weights``,
``resume``, ``destroy``). TRL imports nothing of wvc; the protocol hands the transfer a stream
of tensors alone, so wvc extends ``AsyncGRPOTrainer.__init__`` to hand the trainer to the
transfer it was given (``bind_trainer``), and TRL's rollout worker to tag rollouts with the
servers' version (both in integrations/trl_hooks.py, gated on TRL's version):

- ``init_weight_transfer`` publishes the version the servers were started from (``start=``,
  or the trainer's own model: its directory, or its Hub id in the local Hub cache; model files
  only, and never a path a server names) and points every server at it, so the first sync is
  one step; a run restarted on a branch that has versions goes on from its tip instead;
- ``send_weights(iterator)`` takes a snapshot of TRL's stream of ``(name, tensor)`` pairs (a
  host copy, each tensor cast to the checkpoint's dtype: the trainer is blocked for that copy
  only) and returns; in a background thread the snapshot is committed as one version (TRL's
  model version and global step in its metadata), pushed, and loaded into every server, while
  training goes on. One sync runs at a time; one sent meanwhile waits, and a newer one takes its
  place (``superseded``). A sync's failure is raised by the next ``send_weights`` (and by
  ``wait()``). TRL's rollouts are tagged with the version the servers hold: the rollout
  worker's version moves when the servers have loaded a sync, not when it was sent, so TRL's
  staleness accounting counts what a rollout was really generated with;
- ``pause``/``resume`` do nothing: a server stops generating only while it writes a version
  into its engine (its update runs between engine steps), not for the trainer's whole sync.
  ``background=False`` is the blocking sync (commit, push and load inside ``send_weights``,
  the servers paused around it, as TRL's own transfer does).

Outside TRL, any loop: ``publish(state_dict)`` then ``notify()`` (docs/training.md).

A server that fails a sync (down, slow past ``timeout``, an error) keeps serving the version
it had, whole, or was marked unusable with the reason (the backend fetches a version whole
before writing any of it): the trainer gets one ``WeightSyncError`` naming each server and
why, after every server was tried. A server that missed syncs moves to the newest commit on
the next one (its follower reads the steps it missed); one restarted since is initialized
again first.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .. import ids, settings
from ..api import Repo
from ..read.cache import cache_root
from ..errors import InvalidArgument, NonFastForward, RemoteNotFound, WeightSyncError
from ..remotes import open_backend
from ..remotes.repository import read_branch_tip
from .publisher import KEEP_BYTES, PERIODIC_DEAD_SHARE
from . import trl_hooks
from .sync_queue import SyncQueue
from ..worktree.chunking import TensorStream
from .vllm.server_client import ServerError, VllmServer

log = logging.getLogger(__name__)

# HEAD of the staging repository names a branch nothing commits to: commits onto the synced
# branch then write the repository only, never a working tree (ops/commit.py: refresh_worktree)
STAGING_HEAD = "wvc-staging"
NOT_INITIALIZED = "not initialized"  # what the backend answers a server that has no follower yet


class WvcWeightTransfer:
    """Publish each synced version to ``remote`` (a Storage Bucket, S3, a Hub repo or a
    directory) and load it into every vLLM server in ``servers``.

    ``branch``: the branch the versions go on. ``repo``: the local repository the versions are
    committed in first (default: one per remote and branch under the wvc cache; one transfer
    at a time uses it). ``start``: what the servers were started from (a directory, or a commit
    on the remote); default: the trainer's own model. ``keep``: a retention policy
    (``"last=10,every=100"``, as ``wvc prune`` takes it) applied every ``prune_every`` syncs to the local repository and the
    remote. ``timeout``: seconds a sync may take per server (TRL's ``weight_sync_timeout``).
    ``keep_bytes``: host memory for each sync's raw chunks, kept as the next one's delta bases
    (two such sets at most, as the Publisher keeps). ``api_key``: the servers' ``--api-key``
    (default: ``VLLM_API_KEY``), which their weight routes check. ``background``: syncs run
    off the trainer's thread (default; ``send_weights`` returns once it holds a snapshot), or
    inside ``send_weights`` (False).

    Host memory for syncs in the background: at most two snapshots of the checkpoint (the sync
    running and one waiting), each the size of the checkpoint in its own dtype, besides what
    the commit holds (``keep_bytes``)."""

    def __init__(self, remote: str, servers: Iterable[str] = (), branch: str = "main", *, repo=None,
                 start=None, keep=None, prune_every: int | None = None, timeout: float = 1800.0,
                 device: str = "auto", keep_bytes: int = KEEP_BYTES, api_key: str | None = None,
                 background: bool = True):
        from ..model.keep_policy import KeepPolicy
        from ..store.refs import check_ref_name

        # TRL's version checked, and its trainer extended to hand itself over (another loop needs no TRL)
        trl_hooks.hand_trainer_to(self)
        check_ref_name(branch)
        self.remote, self.branch = str(remote), branch
        self.api_key = api_key if api_key is not None else settings.text("VLLM_API_KEY")
        self.servers = [VllmServer(url, timeout, self.api_key) for url in servers]
        self.repo_path = Path(repo) if repo is not None else _default_repo(self.remote, branch)
        self.start = start
        self.keep = KeepPolicy.of(keep) if keep is not None else None  # a bad policy fails here, not mid-run
        self.prune_every = prune_every or max(1, min(16, self.keep.last if self.keep and self.keep.last else 16))
        self.timeout = timeout
        self.device = device
        self.keep_bytes = keep_bytes
        self.start_commit: str | None = None  # the version the servers were started from, if known
        self.start_uploaded_bytes = 0  # what publishing it sent
        self.commit: str | None = None  # the newest version published
        self.syncs: list[dict] = []  # one per publish: commit, step, seconds, bytes
        self.prunes: list[dict] = []
        self._repo: Repo | None = None
        self._initialized: set[str] = set()  # servers pointed at the branch
        self._since_prune = 0
        self.resumed_from: str | None = None  # the branch's tip when this run found one
        self._lock = None  # the staging repository's, held from the first use to destroy()
        self.background = background
        self._queue = SyncQueue("wvc-trl-sync")
        self._dtypes: dict | None = None  # tensor name -> the checkpoint's torch dtype (the snapshot's casts)
        self._versions = threading.Lock()
        self._asked_version: int | None = None  # what TRL last told its rollout worker
        self._served_version: int | None = None  # TRL's version of the newest sync every server loaded
        self._tell_rollouts = None  # tells TRL's rollout worker a version (set when TRL first tells it one)
        self.trainer = None  # TRL's trainer, once it handed itself over (bind_trainer)

    def bind_trainer(self, trainer) -> None:
        """The trainer whose weights this transfer syncs: its model is what the servers
        start from (when ``start=`` is not given), its ``model_version`` and
        ``state.global_step`` go into each version's metadata, and its ``rollout_worker``
        tags rollouts with what the servers hold. TRL's AsyncGRPOTrainer calls this itself
        when it is built with the transfer (integrations/trl_hooks.py); a loop of its own
        with a trainer of that shape may call it."""
        self.trainer = trainer

    # -- TRL's WeightTransferProtocol ------------------------------------------------------
    def init_weight_transfer(self) -> None:
        """Publish the starting version and point every server at it (train begin). A branch
        that has versions already (a restarted run) goes on from its tip: nothing is published
        again, and the next sync is committed on top of the tip."""
        repo = self._open()
        tip = repo.branch_tip(self.branch)
        self.start_commit = self._publish_start(self.trainer, tip)
        if tip is not None:
            self.commit = self.resumed_from = tip
        elif self.start_commit is not None:
            self.commit = self.start_commit
        if self.commit is not None:  # (else nothing is on the remote yet: each server is initialized at its first load)
            self._each(self._init_server, "init")

    def pause(self) -> None:
        """Blocking syncs only: in-flight requests held while the sync runs. In the background
        a server pauses itself, only while it writes."""
        if not self.background:
            self._each(lambda s: s.pause(timeout=min(self.timeout, 300.0)), "pause")

    def send_weights(self, iterator) -> None:
        """Commit TRL's stream as one version, push it, and load it into every server: in the
        background, from a snapshot taken here (the trainer waits for that copy only), or here
        (``background=False``). A background sync's failure is raised by the next call."""
        version, step = _trl_progress(self.trainer)
        metadata = {"model_version": version, "step": step}
        message = f"trl sync {version}" + (f" (step {step})" if step is not None else "")
        if not self.background:
            self.publish(iterator, metadata=metadata, message=message, prune=False)
            self.notify()
            self._prune_when_due()  # (after the servers hold it: a prune took 6-8 s at 74M)
            return
        self._queue.raise_failure()  # the sync before failed: heard now, as a blocking sync's would have been
        t0 = time.perf_counter()
        with self._queue.foreground():  # (the sync running pauses at its next tensor)
            snapshot = self._snapshot(iterator)
        blocked = time.perf_counter() - t0
        self._hold_rollout_versions(version)
        sent = time.perf_counter()

        def sync() -> None:
            started = time.perf_counter()
            commit = self.publish(_drain(snapshot, self._queue), metadata=metadata, message=message, prune=False)
            self.syncs[-1].update(snapshot_s=blocked, queued_s=started - sent)
            self.notify(commit=commit)
            self.syncs[-1]["done_s"] = time.perf_counter() - sent  # sent -> every server holds it
            self._served(version)
            self._prune_when_due()

        self._queue.submit(sync)

    def resume(self) -> None:
        if not self.background:
            self._each(lambda s: s.resume(timeout=min(self.timeout, 300.0)), "resume")

    @property
    def superseded(self) -> int:
        """Background syncs dropped for a newer one before they started."""
        return self._queue.superseded

    def wait(self, timeout: float | None = None) -> bool:
        """Until the background syncs sent so far are done (False if ``timeout`` seconds
        passed first); raises the failure of one that failed."""
        return self._queue.wait(timeout)

    def destroy(self) -> None:
        """After the background syncs finish (a failure is logged: TRL calls this in a
        ``finally``, where raising would hide the training's own error; ``wait()`` raises it)."""
        try:
            self._queue.wait()
        except Exception as exc:  # noqa: BLE001 - see the docstring
            log.error("wvc: the last weight sync failed: %s", exc)
        if self._repo is not None:
            self._repo.close()
            self._repo = None
        if self._lock is not None:
            self._lock.close()  # (closing the descriptor releases its flock)
            self._lock = None

    # -- any training loop -----------------------------------------------------------------
    def publish(self, weights, *, metadata: dict | None = None, message: str | None = None,
                prune: bool = True) -> str:
        """Commit ``weights`` (a state dict, or ``(name, tensor)`` pairs) as the branch's next
        version and push it; its commit id. With a start version, the tensors take the place of
        its namesakes one at a time (its files, shards, dtypes and frozen tensors kept). Then,
        with ``keep`` and ``prune``, the prune that is due (``send_weights`` prunes only once
        the servers hold the version: before, a sync's servers waited for it)."""
        repo = self._open()
        t0 = time.perf_counter()
        parent = repo.branch_tip(self.branch)
        pairs = weights.items() if isinstance(weights, Mapping) else weights
        if parent is not None:
            pairs = iter(pairs)
            first = next(pairs, None)
            device = "cpu" if first is None else str(first[1].device)
            source = TensorStream(_chain(first, pairs), device=device)
        else:
            # no start version to lay the tensors out by: the whole state dict, in one file
            log.warning("wvc: no start version (start= or a server's --model directory): the first sync "
                        "publishes the whole model, and servers load it whole")
            source = dict(pairs)
        n = len(self.syncs) + 1
        res = repo.commit(message or f"sync {n}", source, metadata=metadata or {}, allow_empty=True,
                          branch=self.branch, device=self.device)
        t1 = time.perf_counter()
        pushed = self._push()
        t2 = time.perf_counter()
        self.commit = res.commit
        self.syncs.append({"commit": res.commit, **(metadata or {}), "commit_s": t1 - t0, "push_s": t2 - t1,
                           "stored_bytes": res.stored_bytes, "uploaded_bytes": pushed.uploaded_bytes,
                           "logical_bytes": res.logical_bytes})
        self._since_prune += 1
        if prune:
            self._prune_when_due()
        return res.commit

    def _prune_when_due(self) -> None:
        if self.keep is not None and self._since_prune >= self.prune_every:
            self.prune()

    def notify(self, servers: Iterable[str] | None = None, commit: str | None = None) -> dict[str, float]:
        """Load ``commit`` (default: the newest published) into every server (or those named),
        all at once; the seconds each took. Raises WeightSyncError naming each server that did
        not load it, after all were tried."""
        commit = commit or self.commit
        if commit is None:
            raise InvalidArgument("nothing published yet: publish() first")
        chosen = self.servers if servers is None else [self._server(url) for url in servers]

        def load(server: VllmServer) -> float:
            t = time.perf_counter()
            if server.url not in self._initialized:
                self._init_server(server)
            try:
                server.load(commit)
            except ServerError as exc:
                if NOT_INITIALIZED not in exc.reason:
                    raise
                self._initialized.discard(server.url)  # restarted since: follow again, then load
                self._init_server(server)
                server.load(commit)
            return time.perf_counter() - t

        seconds = self._each(load, "load", commit=commit, servers=chosen)
        if self.syncs and self.syncs[-1]["commit"] == commit:
            self.syncs[-1]["servers_s"] = seconds
        return seconds

    def prune(self) -> dict:
        """Apply ``keep`` to the branch here and on the remote now."""
        if self.keep is None:
            raise InvalidArgument("no keep= policy to prune by")
        repo = self._open()
        t = time.perf_counter()
        protect = {self.start_commit} if self.start_commit else set()  # what a restarted server is checked against
        here = repo.prune(self.branch, keep=self.keep, protect=protect)
        there = repo.remote_prune("origin", self.branch, keep=self.keep, protect=protect,  # (a restarted server starts at= it)
                                  min_dead_share=PERIODIC_DEAD_SHARE)
        self._since_prune = 0
        entry = {"pruned": here.pruned, "bytes_freed": here.bytes_freed, "remote_pruned": there.pruned,
                 "remote_bytes_freed": there.bytes_freed, "seconds": time.perf_counter() - t}
        self.prunes.append(entry)
        return entry

    # -- the parts -------------------------------------------------------------------------
    def _snapshot(self, iterator) -> dict:
        """TRL's stream copied to host memory, each tensor cast to its dtype in the checkpoint
        (the cast the commit makes: the same bytes, half an fp32 master's size for bf16). Under
        FSDP this is where the gathers happen, on every rank as TRL drives them."""
        dtypes = self._checkpoint_dtypes()
        out = {}
        for name, tensor in iterator:
            held = tensor.detach()
            cast = held.to(dtypes.get(name, held.dtype))  # (on its device: from a GPU, half the bytes cross)
            fresh = cast is not held and cast.device.type == "cpu"  # (a cast on the host is a copy already)
            out[name] = cast if fresh else cast.to("cpu", copy=True)
        return out

    def _checkpoint_dtypes(self) -> dict:
        """Each tensor's dtype in the branch's checkpoint, read once from its tip (every
        sync keeps its parent's layout); empty while the branch has no version, and read only
        while no background sync uses the repository."""
        if self._dtypes or self._queue.busy:
            return self._dtypes or {}
        import torch

        from ..formats.dtypes import DTYPES

        repo = self._open()
        tip = repo.branch_tip(self.branch)
        self._dtypes = {} if tip is None else {
            t.name: getattr(torch, DTYPES[t.dtype].torch_name)
            for f in repo.tree_of(tip).files if f.kind == "safetensors" for t in f.tensors}
        return self._dtypes

    def _hold_rollout_versions(self, version: int | None) -> None:
        """TRL bumps its rollout worker's model version as soon as ``send_weights`` returns,
        and tags each rollout with it; in the background the servers load that version later.
        So TRL's rollout worker passes on at most the version the servers hold (``_served``,
        ``trl_hooks.hold_rollout_versions``): a rollout is tagged with what generated it."""
        worker = getattr(self.trainer, "rollout_worker", None)
        if version is None or worker is None:
            return
        with self._versions:
            if not trl_hooks.hold_rollout_versions(worker, self):
                return
            if self._served_version is None:
                self._served_version = version - 1  # the servers hold what came before this sync

    def _rollout_version(self, worker, model_version: int, tell) -> None:
        """TRL tells ``worker`` its new version: ``tell`` it at most what the servers hold."""
        with self._versions:
            self._asked_version, self._tell_rollouts = model_version, (lambda v: tell(worker, v))
            tell(worker, min(model_version, self._served_version))

    def _served(self, version: int | None) -> None:
        """Every server holds TRL's ``version`` now: the rollout worker may say so."""
        if version is None:
            return
        with self._versions:
            self._served_version = version
            if self._tell_rollouts is not None and self._asked_version is not None:
                self._tell_rollouts(min(self._asked_version, version))

    def _open(self) -> Repo:
        if self._repo is not None:
            return self._repo
        self._lock = self._lock or _staging_lock(self.repo_path, self.remote, self.branch)
        if (self.repo_path / ".wvc").is_dir():
            repo = Repo.open(self.repo_path)
        else:
            repo = Repo.init(self.repo_path)
        if repo.head_branch() != STAGING_HEAD:
            repo.set_head_branch(STAGING_HEAD, "wvc trl: staging")
        urls = repo.remotes()
        if "origin" not in urls:
            repo.remote_add("origin", self.remote)
        elif urls["origin"] != self.remote:
            raise InvalidArgument(f"{self.repo_path} pushes to {urls['origin']}, not {self.remote}: pass repo= "
                                  f"another directory")
        # each sync's raw chunks kept for the next (the Publisher's reason: an anchor step's
        # delta against an older version otherwise decodes its chain, 7-12 s a sync at 0.5B)
        repo.keep_recent_chunks(self.keep_bytes)
        self._repo = repo
        self._catch_up(repo)
        return repo

    def _catch_up(self, repo: Repo) -> None:
        """Start from the remote's branch where it has one (a resumed run, or one whose local
        repository was lost): the next version is committed on top of it."""
        try:
            there = read_branch_tip(open_backend(self.remote), self.branch)
        except RemoteNotFound:
            there = None
        if there is None:
            return
        here = repo.branch_tip(self.branch)
        if here == there or (here is not None and there in set(repo.ancestors(here))):
            return  # up to date, or ahead (an earlier push that did not land is sent next time)
        repo.fetch("origin")
        if here is not None and here not in set(repo.ancestors(there)):
            raise NonFastForward(f"{self.branch} on {self.remote} has commits the local repository "
                                 f"{self.repo_path} does not, and the other way round: use another branch")
        repo.force_branch(self.branch, there)

    def _push(self):
        try:
            return self._repo.push("origin", self.branch)
        except NonFastForward:
            raise NonFastForward(f"another writer moved {self.branch} on {self.remote}: two trainers on one "
                                 f"branch; use another branch") from None

    def _publish_start(self, trainer, tip: str | None) -> str | None:
        """The version the servers were started from: committed and pushed when the branch
        has no version yet; on a branch that has (``tip``: a restarted run), the start its
        first run recorded, nothing published. None when it is not known here (the first
        sync is then the whole model).

        Its files come from ``start=`` or from the trainer's own model (its directory, or its
        Hub id in the local Hub cache), never from a server's answer: a path a server named
        would let it choose which of this machine's directories is published. Only model
        files are committed (MODEL_FILES)."""
        repo = self._repo
        start = self.start
        if isinstance(start, str) and ids.is_object_id(start):
            repo.read_commit(start)  # on the branch fetched from the remote, or an error
            return start
        if tip is not None:
            recorded = _recorded_start(repo, tip)
            log.warning("wvc: %s on %s is at %s already: this run goes on from it (the start version is not "
                        "published again; the next sync is committed on top of it)%s", self.branch, self.remote,
                        tip[:12], f"; servers are checked against the start {recorded[:12]}" if recorded else "")
            return recorded
        directory = Path(start) if start is not None else _model_dir(trainer)
        if directory is None:
            return None
        if not directory.is_dir():
            raise InvalidArgument(f"start={start!r} is neither a directory nor a commit id")
        res = repo.commit(f"start: {directory.name}", str(directory), branch=self.branch,
                          metadata={"start": directory.name}, device=self.device, exclude=NOT_MODEL_FILES)
        self.start_uploaded_bytes = self._push().uploaded_bytes
        return res.commit

    def _init_server(self, server: VllmServer) -> None:
        try:
            server.init(self.remote, self.branch, self.start_commit)
        except ServerError as exc:
            if self.start_commit is None or exc.status is None:
                raise
            # started from other files than the start version (checked chunk by chunk): it
            # follows without it, its first update loading the whole version
            log.warning("wvc: %s does not hold %s (%s): it loads the whole version at its first sync",
                        server.url, self.start_commit[:12], exc.reason)
            server.init(self.remote, self.branch, None)
        self._initialized.add(server.url)

    def _server(self, url: str) -> VllmServer:
        for server in self.servers:
            if server.url == url.rstrip("/"):
                return server
        server = VllmServer(url, self.timeout, self.api_key)
        self.servers.append(server)
        return server

    def _each(self, fn, what: str, *, commit: str | None = None, servers=None) -> dict:
        """``fn(server)`` on every server at once; their results by URL, or one error naming
        every server that failed and why."""
        servers = self.servers if servers is None else servers
        if not servers:
            return {}
        with ThreadPoolExecutor(max_workers=min(32, len(servers)), thread_name_prefix="wvc-sync") as pool:
            futures = {s.url: pool.submit(fn, s) for s in servers}
        out, failures = {}, {}
        for url, future in futures.items():
            try:
                out[url] = future.result()
            except Exception as exc:  # noqa: BLE001 - each server's reason, reported together
                failures[url] = getattr(exc, "reason", None) or f"{type(exc).__name__}: {exc}"
        if failures:
            raise WeightSyncError(f"load {commit[:12]}" if commit else what, failures, commit)
        return out


# What a start version may hold: the files a model directory is loaded from (weights, their
# index, config, tokenizer, chat template); anything else in the directory stays here.
MODEL_FILES = ("*.safetensors", "*.safetensors.index.json", "config.json", "generation_config.json",
               "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
               "vocab.json", "vocab.txt", "merges.txt", "tokenizer.model", "*.tiktoken", "chat_template.json",
               "chat_template.jinja", "preprocessor_config.json")
NOT_MODEL_FILES = ("*", "!*/", *(f"!{p}" for p in MODEL_FILES))  # (gitignore patterns: every file but those)
START_SEARCH = 100_000  # first-parent commits walked back for the start a run recorded


def _recorded_start(repo: Repo, tip: str) -> str | None:
    """The newest commit on ``tip``'s first parents that recorded a start version."""
    cursor = tip
    for _ in range(START_SEARCH):
        commit = repo.read_commit(cursor)
        if "start" in commit.metadata:
            return cursor
        if not commit.parents or not repo.has_commit(commit.parents[0]):
            return None
        cursor = commit.parents[0]
    return None


def _model_dir(trainer) -> Path | None:
    """The trainer's own model on this machine: the directory it was loaded from, or its Hub
    id in the local Hub cache (nothing is downloaded); None when neither is here."""
    model = getattr(trainer, "model", None)
    model = getattr(model, "module", model)  # (DDP / accelerate wrappers)
    name = getattr(model, "name_or_path", None) or getattr(getattr(model, "config", None), "_name_or_path", None)
    if not isinstance(name, str) or not name:
        return None
    if Path(name).is_dir():
        return Path(name)
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name, local_files_only=True))
    except Exception:  # noqa: BLE001 - not here: the first sync is then whole
        log.warning("wvc: the trainer's model %s is not on this machine: pass start= (its directory) so that the "
                    "first sync is one step, not the model", name)
        return None


def _staging_lock(repo_path: Path, remote: str, branch: str):
    """An exclusive flock beside the staging repository, held while a transfer uses it: a
    second transfer on the same remote and branch (one default staging repository) is
    refused with one line, not left to interleave its versions with the first's."""
    import fcntl

    repo_path.parent.mkdir(parents=True, exist_ok=True)
    handle = open(repo_path.parent / (repo_path.name + ".lock"), "a+b")
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise InvalidArgument(f"another trainer is publishing {branch} on {remote} through {repo_path}: two trainers "
                              f"on one branch are refused (give each its own branch)") from None
    return handle


def _drain(snapshot: dict, queue: SyncQueue):
    """A snapshot's pairs, each let go of as the commit takes it; paused while the trainer
    takes the next snapshot (its blocked time is its own work, not a contest for the CPUs)."""
    for name in list(snapshot):
        queue.yield_to_foreground()
        yield name, snapshot.pop(name)


def _chain(first, rest):
    if first is not None:
        yield first
    yield from rest


def _trl_progress(trainer) -> tuple[int | None, int | None]:
    """TRL's model version this sync makes and the global step, read from the bound trainer
    (the model version is bumped after the sync, so this one is the trainer's plus one);
    (None, None) without one."""
    version = getattr(trainer, "model_version", None)
    step = getattr(getattr(trainer, "state", None), "global_step", None)
    return (version + 1 if isinstance(version, int) else None), (step if isinstance(step, int) else None)


def _default_repo(remote: str, branch: str) -> Path:
    key = hashlib.sha256(f"{remote}\0{branch}".encode()).hexdigest()[:16]
    return cache_root() / "trl" / key
