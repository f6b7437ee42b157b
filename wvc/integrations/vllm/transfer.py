"""The ``wvc`` weight-transfer backend of a vLLM server: the trainer sends commit ids, each
worker's follower fetches what changed (no NCCL group: it works on CPU, across machines and
clouds).

    VLLM_SERVER_DEV_MODE=1 python -m vllm.entrypoints.openai.api_server --model CHECKOUT \\
        --weight-transfer-config '{"backend": "wvc"}'

    POST /init_weight_transfer_engine {"init_info": {"remote": URL, "branch": "main", "commit": ID}}
    POST /start_weight_update
    POST /update_weights {"update_info": {"commit": ID}}        (no commit: the branch's tip)
    POST /finish_weight_update {"weight_version": ID}
    GET  /weight_info                                           -> {"weight_version": ID}

``commit`` at init is the version the server was started from (its ``--model`` directory is
that checkout; checked): the first update then downloads one step. A failed update is the
route's error: fetched first, so the engine still serves the old version; a failure while
writing into the engine marks it unusable (every later update says why). The version the
server reports is the commit loaded (plugin.py checks ``weight_version`` against it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from vllm.distributed.weight_transfer.base import WeightTransferEngine, WeightTransferInitInfo, WeightTransferUpdateInfo

from ...errors import WvcError
from .engine_weights import EngineWeights
from .session import EngineFollower


@dataclass
class WvcInitInfo(WeightTransferInitInfo):
    remote: str
    branch: str = "main"
    commit: str | None = None  # the version the engine was started from


@dataclass
class WvcUpdateInfo(WeightTransferUpdateInfo):
    commit: str | None = None  # None: the branch's tip
    timeout: float | None = None  # seconds to wait for a commit newer than the one held


class WvcWeightTransferEngine(WeightTransferEngine[WvcInitInfo, WvcUpdateInfo]):
    init_info_cls = WvcInitInfo
    update_info_cls = WvcUpdateInfo
    supports_draft_weight_update = False

    session: EngineFollower | None = None
    last_update = None

    def init_transfer_engine(self, init_info: WvcInitInfo) -> None:
        model, config = self.model, self.vllm_config
        self.session = EngineFollower(lambda names: EngineWeights(model, config, names), init_info.remote,
                                      init_info.branch, at=init_info.commit, model=self.model_config.model,
                                      revision=self.model_config.revision)

    def start_weight_update(self) -> None:
        if self.session is None:
            raise WvcError("the wvc weight transfer is not initialized: POST /init_weight_transfer_engine first")
        if self.session.unusable is not None:
            raise WvcError(f"this engine must be restarted: {self.session.unusable}")

    def update_weights(self, update_info: dict) -> None:
        self.receive_weights(self.parse_update_info(update_info))
        if torch.accelerator.is_available():
            torch.accelerator.synchronize()

    def receive_weights(self, update_info: WvcUpdateInfo) -> None:
        self.start_weight_update()
        self.last_update = self.session.update(update_info.commit, update_info.timeout)

    def finish_weight_update(self) -> None:
        pass  # each update is applied whole in update_weights

    def shutdown(self) -> None:
        self.session = None


LOADED_COMMIT = "wvc_loaded_commit"  # the worker method plugin.py calls on every worker


def _loaded_commit(worker) -> str | None:
    """The commit a worker's engine holds."""
    engine = getattr(worker, "weight_transfer_engine", None)
    session = getattr(engine, "session", None)
    return None if session is None else session.commit


def _add_worker_method() -> None:
    """A worker method, by name: a server's engine core reaches workers by method name only
    (a function would have to be pickled across, which vLLM refuses by default). Added to
    vLLM's worker wrapper when this module is imported, i.e. in a worker whose engine uses
    the wvc backend; the wrapper hands everything else to its worker."""
    from vllm.v1.worker.worker_base import WorkerWrapperBase

    if not hasattr(WorkerWrapperBase, LOADED_COMMIT):
        setattr(WorkerWrapperBase, LOADED_COMMIT, _loaded_commit)


_add_worker_method()
