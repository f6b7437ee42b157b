"""The ``vllm.general_plugins`` entry point (pyproject.toml): registers the ``wvc``
weight-transfer backend in every vLLM process (its class imported only when a server is
configured with it), and makes the version a server reports the commit its workers hold."""

from __future__ import annotations

BACKEND = "wvc"
LOADED_COMMIT = "wvc_loaded_commit"  # (transfer.py adds it to vLLM's workers; not imported here: it imports vLLM's worker side)


def register() -> None:
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    if BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(BACKEND, "wvc.integrations.vllm.transfer", "WvcWeightTransferEngine")
    _report_loaded_commit()


_reporting = False  # AsyncLLM extended in this process (a plugin may be loaded more than once)


def _report_loaded_commit() -> None:
    """``/finish_weight_update {"weight_version": V}`` sets what ``/weight_info`` reports to
    whatever the trainer says. With the wvc backend the workers know which commit they hold:
    the version is set to it, and a ``weight_version`` that names another commit is refused
    (the route's error) rather than reported."""
    try:
        from vllm.v1.engine.async_llm import AsyncLLM
    except ImportError:  # pragma: no cover - another vLLM layout: versions as the trainer says
        return
    global _reporting
    if _reporting:
        return
    _reporting = True
    original = AsyncLLM.finish_weight_update

    async def finish_weight_update(self, weight_version: str | None = None) -> None:
        config = getattr(self.vllm_config, "weight_transfer_config", None)
        if config is None or config.backend != BACKEND:
            return await original(self, weight_version)
        await self.collective_rpc("finish_weight_update")
        held = set(await self.collective_rpc(LOADED_COMMIT))
        if len(held) != 1 or None in held:
            raise RuntimeError(f"wvc: the workers hold {sorted(map(str, held))}, not one commit")
        commit = held.pop()
        await self.update_weight_version(commit)
        if weight_version is not None and not commit.startswith(weight_version):
            raise ValueError(f"wvc: weight_version {weight_version} is not the commit loaded ({commit}); "
                             f"the server reports {commit}")

    init_original = AsyncLLM.init_weight_transfer_engine

    async def init_weight_transfer_engine(self, request) -> None:
        await init_original(self, request)
        config = getattr(self.vllm_config, "weight_transfer_config", None)
        if config is not None and config.backend == BACKEND:
            held = set(await self.collective_rpc(LOADED_COMMIT))
            if len(held) == 1 and None not in held:  # started from a known commit (init_info's)
                await self.update_weight_version(held.pop())

    # vLLM has no hook for what a backend's workers report back: its engine client is
    # extended here (a server builds that class itself, so it cannot be handed a subclass)
    AsyncLLM.finish_weight_update = finish_weight_update
    AsyncLLM.init_weight_transfer_engine = init_weight_transfer_engine
