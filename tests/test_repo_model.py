"""Property test: random commit / branch / checkout sequences against an in-memory model."""

import torch
from hypothesis import settings
from hypothesis import strategies as hs
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from safetensors.torch import save

from wvc import Repo

from .conftest import tree_digests

PATHS = ["model.safetensors", "config.json", "sub/adapter.safetensors", "notes.txt"]


def content_for(path: str, seed: int) -> bytes:
    if path.endswith(".safetensors"):
        g = torch.Generator().manual_seed(seed)
        return save({"w": (torch.randn(64, 8, generator=g) * 0.02).to(torch.bfloat16), "b": torch.arange(seed % 5)})
    return f"content {seed}\n".encode() * (seed % 7)


class RepoMachine(RuleBasedStateMachine):
    @initialize()
    def setup(self):
        import tempfile
        from pathlib import Path

        self.tmp = tempfile.TemporaryDirectory()
        self.repo = Repo.init(Path(self.tmp.name) / "m", chunk_bytes=256)
        self.files: dict[str, bytes] = {}  # what the working tree should hold
        self.commits: dict[str, dict[str, bytes]] = {}
        # every commit made, in order: what the rules draw from. Not the ids' set: two
        # commits of one tree and parent in the same second are one id, so its size (and
        # with it hypothesis' draws) depended on the clock, which hypothesis reports as a
        # flaky strategy
        self.made: list[str] = []
        self.branches: dict[str, str] = {}
        self.head: str | None = None

    def switch_to(self, commit_id):
        """Model of checkout --force: target files, plus untracked files left alone (as git)."""
        tracked = self.commits[self.head] if self.head else {}
        target = self.commits[commit_id]
        untracked = {p: d for p, d in self.files.items() if p not in tracked and p not in target}
        self.files = {**target, **untracked}
        self.head = commit_id

    def teardown(self):
        self.repo.close()
        self.tmp.cleanup()

    @rule(path=hs.sampled_from(PATHS), seed=hs.integers(0, 50))
    def write(self, path, seed):
        data = content_for(path, seed)
        target = self.repo.root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        self.files[path] = data

    @rule(path=hs.sampled_from(PATHS))
    def delete(self, path):
        if path in self.files:
            (self.repo.root / path).unlink()
            del self.files[path]

    @rule()
    def commit(self):
        res = self.repo.commit("c", allow_empty=True)
        self.commits[res.commit] = dict(self.files)
        self.made.append(res.commit)
        self.head = res.commit
        branch = self.repo.head_branch()
        if branch:
            self.branches[branch] = res.commit

    @precondition(lambda self: self.commits)
    @rule(name=hs.sampled_from(["exp-a", "exp-b", "feature/x"]), data=hs.data())
    def branch_and_switch(self, name, data):
        start = data.draw(hs.sampled_from(self.made))
        if name not in self.branches:
            self.repo.create_branch(name, start)
            self.branches[name] = start
        self.repo.checkout(name, force=True)
        self.switch_to(self.branches[name])

    @precondition(lambda self: self.commits)
    @rule(data=hs.data())
    def checkout_commit(self, data):
        commit_id = data.draw(hs.sampled_from(self.made))
        self.repo.checkout(commit_id, force=True)
        self.switch_to(commit_id)

    @invariant()
    def working_tree_matches_model(self):
        if not hasattr(self, "repo"):
            return
        import hashlib

        expected = {p: hashlib.sha256(d).hexdigest() for p, d in self.files.items()}
        assert tree_digests(self.repo.root) == expected


RepoMachine.TestCase.settings = settings(max_examples=20, stateful_step_count=12, deadline=None)
TestRepoModel = RepoMachine.TestCase
