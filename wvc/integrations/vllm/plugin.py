"""The ``vllm.general_plugins`` entry point (pyproject.toml): registers the ``wvc``
weight-transfer backend in every vLLM process (its class imported only when a server is
configured with it), and makes the version a server reports the commit its workers hold."""

from __future__ import annotations

import logging
import weakref

from .shared_names import LOADED_COMMIT, PREFETCH, PREFETCHING, REMOTE_ENV, UNUSABLE

BACKEND = "wvc"


_extended = False  # vLLM's classes extended in this process (a plugin may be loaded more than once)


def register() -> None:
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    from ..library_versions import installed, refusal

    try:  # vLLM's public registration (a server that names it hears a version's problem from it)
        WeightTransferEngineFactory.register_engine(BACKEND, "wvc.integrations.vllm.transfer", "WvcWeightTransferEngine")
    except ValueError:  # registered already: the plugin runs once per process, or more
        pass
    global _extended
    if _extended:
        return
    _extended = True
    why = refusal("vllm", installed("vllm") or "0")
    if why is not None:
        # vLLM's classes are extended below by name and signature: on a vLLM they were not
        # built for, leave them alone (every vLLM process loads this plugin, wvc or not)
        logging.getLogger(__name__).warning("wvc: %s; the wvc backend is not enabled in this process", why)
        return
    _report_loaded_commit()
    _reset_caches_after_updates()
    _guard_weight_routes()
    try:
        from vllm.v1.worker.worker_base import WorkerWrapperBase
    except ImportError:  # pragma: no cover - another vLLM layout
        return
    from .offline import add_worker_methods
    from .worker_methods import add_follower_methods

    add_worker_methods(WorkerWrapperBase)  # attach() reaches workers by method name
    add_follower_methods(WorkerWrapperBase)  # a server's engine asks its workers' followers by method name


# Worker calls after which cached KV holds values computed with the old weights: the wvc
# backend's update, and the worker extension's (offline.WorkerExtension)
UPDATES = ("update_weights", "wvc_update")


def _changed_weights(engine, method, results) -> bool:
    if method == "wvc_update":
        return any(r is not None for r in results or ())
    return method == "update_weights" and _uses_backend(engine)


def _reset_caches_after_updates() -> None:
    """Every path that changes an engine's weights through wvc (the server's /update_weights,
    an offline engine's ``update_weights``, ``collective_rpc("wvc_update")`` in or out of a
    server) resets the prefix cache itself, running requests included: blocks computed with
    the old weights were reused by the first requests after an update unless the caller
    remembered /pause or ``reset_prefix_cache``. Both engine clients funnel those calls
    through ``collective_rpc``, so that is where it is done."""
    try:
        from vllm.v1.engine.async_llm import AsyncLLM
        from vllm.v1.engine.llm_engine import LLMEngine
    except ImportError:  # pragma: no cover - another vLLM layout
        return
    sync_original, async_original = LLMEngine.collective_rpc, AsyncLLM.collective_rpc

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        results = sync_original(self, method, timeout, args, kwargs)
        if method in UPDATES and _changed_weights(self, method, results):
            self.reset_prefix_cache(reset_running_requests=True)
        return results

    async def collective_rpc_async(self, method, timeout=None, args=(), kwargs=None):
        results = await async_original(self, method, timeout, args, kwargs)
        if method in UPDATES and _changed_weights(self, method, results):
            await self.reset_prefix_cache(reset_running_requests=True)
        return results

    LLMEngine.collective_rpc = collective_rpc
    AsyncLLM.collective_rpc = collective_rpc_async


# What vLLM's dev mode (VLLM_SERVER_DEV_MODE=1) mounts beside the OpenAI routes: its RL routes
# (weights, pause/resume, versions) and its dev routes (collective_rpc, caches, sleep). vLLM's
# --api-key guards /v1, /v2, /inference and /cohere only, so anyone who reached the port could
# move the weights; on a server with the wvc backend, a key guards these too.
WEIGHT_ROUTES = frozenset({
    "/pause", "/resume", "/abort_requests", "/is_paused", "/init_weight_transfer_engine",
    "/shutdown_weight_transfer_engine", "/start_weight_update", "/start_draft_weight_update", "/update_weights",
    "/finish_weight_update", "/update_weight_version", "/weight_info", "/weight_checker", "/get_world_size",
    "/server_info", "/reset_prefix_cache", "/reset_mm_cache", "/reset_encoder_cache", "/collective_rpc",
    "/sleep", "/release_kv_cache_memory", "/wake_up", "/is_sleeping"})


def _uses_wvc(scope) -> bool:
    """Whether the app serving ``scope`` runs the wvc backend (unknown: guarded too)."""
    state = getattr(scope.get("app"), "state", None)
    config = getattr(getattr(state, "vllm_config", None), "weight_transfer_config", None)
    backend = getattr(config, "backend", None)
    return backend is None or backend == BACKEND


def _guard_weight_routes() -> None:
    """vLLM's key middleware (present only when a key is configured) made to check the key on
    WEIGHT_ROUTES too, for a server with the wvc backend."""
    try:
        from starlette.datastructures import Headers
        from starlette.responses import JSONResponse
        from vllm.entrypoints.serve.middleware.authenticate import AuthenticationMiddleware
    except ImportError:  # pragma: no cover - another vLLM layout
        return
    original = AuthenticationMiddleware.__call__

    def __call__(self, scope, receive, send):
        if scope.get("type") == "http" and scope.get("method") != "OPTIONS":
            path = scope["path"].removeprefix(scope.get("root_path", "")).rstrip("/")
            if path in WEIGHT_ROUTES and _uses_wvc(scope) and not self.verify_token(Headers(scope=scope)):
                return JSONResponse(content={"error": "Unauthorized"}, status_code=401)(scope, receive, send)
        return original(self, scope, receive, send)

    AuthenticationMiddleware.__call__ = __call__


# engine client -> why it must not serve (a worker holds parts of two versions); vLLM's class
# is not given attributes
_UNUSABLE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
# engine client -> (remote, branch) its workers follow (transfer.followed, at init)
_FOLLOWED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _uses_backend(engine) -> bool:
    config = getattr(getattr(engine, "vllm_config", None), "weight_transfer_config", None)
    return config is not None and config.backend == BACKEND


def _one_commit(held: list) -> str | None:
    """The one commit every worker holds; None before anything is loaded (init without a
    commit); an error when workers differ."""
    held = set(held)
    if held == {None}:
        return None
    if len(held) != 1 or None in held:
        raise RuntimeError(f"wvc: the workers hold {sorted(map(str, held))}, not one commit")
    return held.pop()


def _label_error(label: str, commit: str | None) -> ValueError:
    held = f"the commit its workers hold ({commit})" if commit else "the commit its workers hold, and none is loaded yet"
    return ValueError(f"wvc: weight_version {label!r} is refused: the version an engine reports is {held}")


def _report_loaded_commit() -> None:
    """The version an engine reports is the commit its workers hold, on the server
    (``AsyncLLM``) and offline (``LLM``) alike: ``/finish_weight_update {"weight_version": V}``
    and ``/update_weight_version`` would set it to whatever a caller says, so with the wvc
    backend a label that is not that commit (or a prefix of it) is refused, and
    ``/weight_info`` asks the workers. Also: a wait for a new commit (``update_info.timeout``)
    happens here, off the engine, so serving goes on meanwhile."""
    try:
        from vllm.v1.engine.async_llm import AsyncLLM
    except ImportError:  # pragma: no cover - another vLLM layout: versions as the trainer says
        return
    original = AsyncLLM.finish_weight_update
    set_original = AsyncLLM.update_weight_version

    async def finish_weight_update(self, weight_version: str | None = None) -> None:
        if not _uses_backend(self):
            return await original(self, weight_version)
        await self.collective_rpc("finish_weight_update")
        commit = _one_commit(await self.collective_rpc(LOADED_COMMIT))
        if commit is not None:
            await set_original(self, commit)
        if weight_version is not None and (commit is None or not commit.startswith(weight_version)):
            raise _label_error(weight_version, commit)

    async def update_weight_version(self, new_version: str) -> None:
        if not _uses_backend(self):
            return await set_original(self, new_version)
        commit = _one_commit(await self.collective_rpc(LOADED_COMMIT))
        if commit is None or not commit.startswith(new_version):
            raise _label_error(new_version, commit)
        await set_original(self, commit)

    init_original = AsyncLLM.init_weight_transfer_engine

    async def init_weight_transfer_engine(self, request) -> None:
        if _uses_backend(self):
            import asyncio

            followed = _checked_init(request.init_info)  # (a ValueError: the route's 400, workers untouched)
            problem = await asyncio.to_thread(_unreadable, followed[0])
            if problem:
                raise ValueError(f"wvc: the remote this server follows ({REMOTE_ENV}) cannot be read: {problem}")
            _FOLLOWED[self] = followed
        await init_original(self, request)
        if _uses_backend(self):
            commit = _one_commit(await self.collective_rpc(LOADED_COMMIT))
            if commit is not None:  # started from a known commit (init_info's)
                await set_original(self, commit)

    update_original = AsyncLLM.update_weights

    async def update_weights(self, request) -> None:
        if not _uses_backend(self):
            return await update_original(self, request)
        request = await _wait_for_new_commit(self, request)
        if request is None:
            return None  # nothing new within the wait
        await _prefetch(self, request)
        try:
            return await update_original(self, request)  # (the workers write only: the engine's pause)
        except BaseException:
            await _stop_serving_if_unusable(self)
            raise

    version_original = AsyncLLM.get_weight_version

    async def get_weight_version(self):
        reason = _UNUSABLE.get(self)
        if reason:
            return f"unusable: {reason}"
        if _uses_backend(self):
            commit = _one_commit(await self.collective_rpc(LOADED_COMMIT))
            if commit is not None:
                return commit
        return await version_original(self)

    dead_original = AsyncLLM.dead_error

    def dead_error(self):
        reason = _UNUSABLE.get(self)
        if reason:
            from vllm.v1.engine.exceptions import EngineDeadError

            return EngineDeadError(f"wvc: this engine must be restarted: {reason}")
        return dead_original.fget(self)

    # vLLM has no hook for what a backend's workers report back: its engine client is
    # extended here (a server builds that class itself, so it cannot be handed a subclass)
    AsyncLLM.finish_weight_update = finish_weight_update
    AsyncLLM.update_weight_version = update_weight_version
    AsyncLLM.init_weight_transfer_engine = init_weight_transfer_engine
    AsyncLLM.update_weights = update_weights
    AsyncLLM.get_weight_version = get_weight_version
    AsyncLLM.dead_error = property(dead_error)
    errored_original = AsyncLLM.errored
    AsyncLLM.errored = property(lambda self: bool(_UNUSABLE.get(self)) or errored_original.fget(self))
    _report_offline()


def _report_offline() -> None:
    """The same labels rule for an offline ``LLM`` (vLLM's RLOfflineMixin)."""
    try:
        from vllm.entrypoints.rl.offline import RLOfflineMixin
    except ImportError:  # pragma: no cover - another vLLM layout
        return

    finish_original, set_original = RLOfflineMixin.finish_weight_update, RLOfflineMixin.update_weight_version
    get_original = RLOfflineMixin.get_weight_version

    def held(llm) -> str | None:
        return _one_commit(llm.llm_engine.collective_rpc(LOADED_COMMIT))

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        if not _uses_backend(self.llm_engine):
            return finish_original(self, weight_version)
        self.llm_engine.collective_rpc("finish_weight_update")
        commit = held(self)
        if commit is not None:
            self.llm_engine.set_weight_version(commit)
        if weight_version is not None and (commit is None or not commit.startswith(weight_version)):
            raise _label_error(weight_version, commit)

    def update_weight_version(self, new_version: str) -> None:
        if not _uses_backend(self.llm_engine):
            return set_original(self, new_version)
        commit = held(self)
        if commit is None or not commit.startswith(new_version):
            raise _label_error(new_version, commit)
        self.llm_engine.set_weight_version(commit)

    def get_weight_version(self) -> str:
        if _uses_backend(self.llm_engine):
            commit = held(self)
            if commit is not None:
                return commit
        return get_original(self)

    RLOfflineMixin.finish_weight_update = finish_weight_update
    RLOfflineMixin.update_weight_version = update_weight_version
    RLOfflineMixin.get_weight_version = get_weight_version


def _checked_init(info) -> tuple[str, str]:
    """(remote, branch) an init asks for, checked before any worker is: fields the wvc
    backend does not take (an NCCL backend's, say) and a remote or branch that is not the
    server's are the caller's error (ValueError, which vLLM answers 400), not a worker's 500."""
    from ...errors import WvcError
    from .transfer import WvcInitInfo, followed

    if not isinstance(info, dict):
        raise ValueError("wvc: init_info must be an object")
    unknown = sorted(set(info) - {"remote", "branch", "commit"})
    if unknown:
        raise ValueError(f"wvc: init_info takes commit (and remote, branch: the server's own), not "
                         f"{', '.join(map(str, unknown))[:200]}")
    for key in ("remote", "branch", "commit"):
        if info.get(key) is not None and not isinstance(info[key], str):
            raise ValueError(f"wvc: init_info.{key} must be a string")
    try:
        return followed(WvcInitInfo(remote=info.get("remote"), branch=info.get("branch")))
    except WvcError as exc:
        raise ValueError(str(exc)) from None


POLL_SECONDS = (0.25, 5.0)  # a wait for a new commit: first and longest pause between reads of the ref


async def _wait_for_new_commit(engine, request):
    """``update_info.timeout``: wait up to that many seconds for the branch to move past the
    commit the workers hold, here in the server's event loop (serving goes on), then ask the
    workers for that commit; None when nothing new came. Before, the wait happened inside the
    workers' RPC and every completion waited with it."""
    import asyncio
    import time

    from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

    info = dict(request.update_info or {})
    timeout = info.pop("timeout", None)
    if timeout is None or info.get("commit"):
        return WeightTransferUpdateRequest(update_info=info)
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not 0 <= timeout <= 86400:
        raise ValueError(f"wvc: update_info.timeout must be seconds (0 to 86400), not {timeout!r}")
    followed = _FOLLOWED.get(engine)
    if followed is None:
        raise RuntimeError("the wvc weight transfer is not initialized: POST /init_weight_transfer_engine first")
    held = _one_commit(await engine.collective_rpc(LOADED_COMMIT))
    deadline, pause = time.monotonic() + timeout, POLL_SECONDS[0]
    while True:
        tip = await asyncio.to_thread(_branch_tip, *followed)
        if tip is not None and tip != held:
            return WeightTransferUpdateRequest(update_info={**info, "commit": tip})
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        await asyncio.sleep(min(pause, left))  # (a poll of the remote's ref: nothing to wait on but time)
        pause = min(pause * 2, POLL_SECONDS[1])


PREFETCH_POLL_SECONDS = (0.02, 0.25)  # first and longest pause between asking the workers whether they have fetched


async def _prefetch(engine, request) -> None:
    """Every worker fetches the update's version into its host copy in a thread of its own
    while the engine goes on serving; only then is the update sent, which writes. Before,
    the whole update (download, decode, verify, write) ran inside the workers' RPC, between
    two engine steps, and every request waited for all of it. A fetch's failure is raised by
    the update itself (nothing written)."""
    import asyncio

    commit = (request.update_info or {}).get("commit")
    if commit is not None and not isinstance(commit, str):
        return  # (the update refuses it)
    await engine.collective_rpc(PREFETCH, args=(commit,))
    pause = PREFETCH_POLL_SECONDS[0]
    while any(await engine.collective_rpc(PREFETCHING)):
        await asyncio.sleep(pause)  # (the workers' threads: nothing here to wait on but their answer)
        pause = min(pause * 2, PREFETCH_POLL_SECONDS[1])


def _unreadable(remote: str) -> str | None:
    """Why ``remote`` cannot be followed (nothing there, or not a wvc remote), or None."""
    from ...errors import WvcError
    from ...remotes import open_backend
    from ...remotes.repository import read_state

    try:
        read_state(open_backend(remote))
    except WvcError as exc:
        return str(exc)
    return None


def _branch_tip(remote: str, branch: str) -> str | None:
    from ...errors import RemoteNotFound
    from ...remotes import open_backend
    from ...remotes.repository import read_branch_tip

    try:
        return read_branch_tip(open_backend(remote), branch)
    except RemoteNotFound:
        return None


async def _stop_serving_if_unusable(engine) -> None:
    """After a failed update: if a worker's engine holds parts of two versions (session.py
    marks it unusable), the server stops answering from it: the engine client reports itself
    errored, as for a dead engine core, so /health answers 503 and every completion fails with the reason (a supervisor
    restarts it); /weight_info says it is unusable. A refused update (fetched first, nothing
    written) leaves it serving its version."""
    import logging

    try:
        reasons = [r for r in await engine.collective_rpc(UNUSABLE) if r]
    except Exception as exc:  # noqa: BLE001 - workers that cannot say: assume the worst
        reasons = [f"its workers could not say what they hold after a failed update ({exc})"]
    if not reasons:
        return
    _UNUSABLE[engine] = reasons[0]
    logging.getLogger(__name__).error("wvc: the engine stops serving: %s", reasons[0])
