"""The ``wvc`` weight-transfer backend of a vLLM server: the trainer sends commit ids, the
server's follower fetches what changed (one for all its tensor-parallel workers: session.py;
no NCCL group: it works on CPU, across machines and clouds).

    WVC_VLLM_REMOTE=URL [WVC_VLLM_BRANCH=main] VLLM_SERVER_DEV_MODE=1 \\
        python -m vllm.entrypoints.openai.api_server --model CHECKOUT --api-key KEY \\
        --weight-transfer-config '{"backend": "wvc"}'

    POST /init_weight_transfer_engine {"init_info": {"commit": ID}}   (remote, branch: the server's)
    POST /start_weight_update
    POST /update_weights {"update_info": {"commit": ID}}        (no commit: the branch's tip)
    POST /finish_weight_update {"weight_version": ID}
    GET  /weight_info                                           -> {"weight_version": ID}

The remote (and, with ``WVC_VLLM_BRANCH``, the branch) a server follows is fixed by whoever
starts it, in its environment: a route's caller may name them only as they are (a caller who
could name another remote would make the server load any repository its credentials or its
disk reach), and an engine started without ``WVC_VLLM_REMOTE`` refuses to initialize. With a
key (``--api-key``), these routes and vLLM's other dev-mode routes need it (plugin.py).

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

from ...errors import TransferNotInitialized, WvcError
from .engine_weights import EngineWeights
from .shared_names import BRANCH_ENV, REMOTE_ENV
from . import server_group
from .session import EngineFollower


@dataclass
class WvcInitInfo(WeightTransferInitInfo):
    remote: str | None = None  # only the server's own (REMOTE_ENV), as a check
    branch: str | None = None
    commit: str | None = None  # the version the engine was started from


def _same_remote(a: str, b: str) -> bool:
    """Whether two spellings name one remote (a directory: relative or absolute, file://)."""
    import os

    from ...remotes.urls import local_path

    def norm(url: str) -> str:
        path = local_path(url)
        return url.rstrip("/") if path is None else os.path.realpath(path)

    return norm(a) == norm(b)


def followed(init_info: WvcInitInfo, environ: dict | None = None) -> tuple[str, str]:
    """(remote, branch) this server follows: its environment's (``environ``: another's, for a
    test); what init names must agree."""
    from ... import settings

    lookup = settings.text if environ is None else environ.get
    remote, branch = lookup(REMOTE_ENV), lookup(BRANCH_ENV)
    if not remote:
        raise WvcError(f"this server follows no remote: start it with {REMOTE_ENV}=<remote url> (and "
                       f"{BRANCH_ENV}=<branch>) in its environment; a route's caller cannot choose one")
    if init_info.remote is not None and not _same_remote(init_info.remote, remote):
        raise WvcError(f"this server follows {remote} only (set by {REMOTE_ENV} when it was started), "
                       f"not {init_info.remote}")
    if branch and init_info.branch is not None and init_info.branch != branch:
        raise WvcError(f"this server follows branch {branch} only (set by {BRANCH_ENV}), not {init_info.branch}")
    return remote, branch or init_info.branch or "main"


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
        from ..library_versions import require

        require("vllm")  # (the plugin left vLLM alone on another version: say why here)
        model, config = self.model, self.vllm_config
        remote, branch = followed(init_info)
        session = EngineFollower(lambda names: EngineWeights(model, config, names), remote,
                                 branch, at=init_info.commit, model=self.model_config.model,
                                 revision=self.model_config.revision, group=server_group.of_worker())
        self.session = None if session.failed is not None else session  # (failed: the last worker raised it)

    def start_weight_update(self) -> None:
        if self.session is None:
            raise TransferNotInitialized("the wvc weight transfer is not initialized: POST "
                                         "/init_weight_transfer_engine first")
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
