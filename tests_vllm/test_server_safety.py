"""A vLLM server with the ``wvc`` backend serves only what it was told to (issue 64):

- it reports the commit its workers hold, and no route relabels it (finding 10); a wait for
  a new commit does not hold up completions (finding 9);

- the remote it follows is fixed by whoever starts it (``WVC_VLLM_REMOTE``), never chosen by a
  route's caller, and with ``--api-key`` its weight routes need the key (finding 3);
- from the moment a write into the engine fails midway (parts of two versions held), it
  answers no completion, fails its health check, and ``/weight_info`` says why (finding 4).

One real server over HTTP for both (the second leaves it unusable, so it comes last)."""

import json
import os
import threading
import time
import urllib.error
import urllib.request

import pytest
import torch

from wvc import Repo

from . import models
from .conftest import Trainer
from .engine import server
from .test_server import http_probe

KEY = "k-3f9a"
# Loaded by every Python process of the server (PYTHONPATH): a write into the engine that
# stops midway, after part of the version went in (what a device error or a killed copy does)
INJECT = '''
import os
if os.environ.get("WVC_TEST_FAIL_WRITE"):
    from wvc.integrations.vllm import engine_weights

    _apply = engine_weights.EngineWeights.apply

    def apply(self, host, changed, patches=None, prepared=None):
        if not os.path.exists(os.environ["WVC_TEST_FAIL_WRITE"]):  # (the test creates it when the write must fail)
            return _apply(self, host, changed, patches, prepared)
        first = sorted(changed)[:1]
        _apply(self, host, first, None if patches is None else {k: v for k, v in patches.items() if k in first})
        raise RuntimeError("injected: the copy into the engine stopped midway")

    engine_weights.EngineWeights.apply = apply
if os.environ.get("WVC_TEST_HOLD_FETCH"):
    import time
    from wvc.read import follower

    _update = follower.Follower.update

    def update(self, rev=None, timeout=None):
        hold = os.environ["WVC_TEST_HOLD_FETCH"]
        if os.path.exists(hold):  # (the test creates it when a fetch must wait, and removes it to let it go)
            open(hold + ".held", "w").close()
            while os.path.exists(hold):
                time.sleep(0.05)
        return _update(self, rev, timeout)

    follower.Follower.update = update
'''


def _call(url: str, body: dict | None = None, *, key: str | None = None, method: str = "POST",
          timeout: float = 300) -> tuple[int, str]:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    data = None if method == "GET" else json.dumps(body or {}).encode()
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def _wait_for(path, seconds: float = 300) -> None:
    """Until ``path`` exists (a server process signals by creating it)."""
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} did not appear"
        time.sleep(0.05)


def _keyed_probe(base: str, model_dir) -> list:
    """http_probe with the key (the OpenAI routes need it on a keyed server)."""
    opener = urllib.request.build_opener()
    opener.addheaders = [("Authorization", f"Bearer {KEY}")]
    was = urllib.request._opener
    urllib.request.install_opener(opener)
    try:
        return http_probe(base, model_dir)
    finally:
        urllib.request.install_opener(was)


def test_only_the_servers_own_remote_with_its_key_moves_its_weights_and_a_broken_write_stops_serving(tmp_path):
    trainer = Trainer(tmp_path, tied=False, dtype=torch.bfloat16)
    start_dir = trainer.checkout(trainer.first)
    # another repository on the same machine, holding other weights: what an attacker names
    other = tmp_path / "other"
    models.build(other, tied=False, dtype=torch.bfloat16, seed=7)
    evil = Repo.init(other)
    evil.remote_add("origin", str(tmp_path / "evil-remote"))
    evil_commit = evil.commit("other weights").commit
    evil.push()
    inject = tmp_path / "inject"
    inject.mkdir()
    (inject / "sitecustomize.py").write_text(INJECT)
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(inject), os.environ.get("PYTHONPATH")])),
           "WVC_TEST_FAIL_WRITE": str(tmp_path / "fail-the-next-write"),
           "WVC_TEST_HOLD_FETCH": str(tmp_path / "hold-the-fetch")}
    with server(start_dir, tmp_path / "server.log", wvc_backend=True, remote=trainer.remote, api_key=KEY,
                env_extra=env) as base:
        before = _keyed_probe(base, start_dir)
        # finding 3: no key, no weight route
        for route, body in (("/init_weight_transfer_engine", {"init_info": {"remote": str(tmp_path / "evil-remote"),
                                                                            "commit": None}}),
                            ("/start_weight_update", {}), ("/update_weights", {"update_info": {"commit": evil_commit}}),
                            ("/update_weight_version", {"new_version": "x"}),
                            ("/collective_rpc", {"method": "reload_weights"})):
            status, text = _call(base + route, body)
            assert status == 401, (route, status, text)
        # with the key, a remote other than the server's own is refused, by name: the caller's error
        status, text = _call(base + "/init_weight_transfer_engine",
                             {"init_info": {"remote": str(tmp_path / "evil-remote")}}, key=KEY)
        assert status == 400 and "WVC_VLLM_REMOTE" in text, text
        # finding 12: a server whose remote does not exist says so at init, not at the first update
        remote_dir = tmp_path / "remote"
        hidden = remote_dir.rename(tmp_path / "remote-hidden")
        status, text = _call(base + "/init_weight_transfer_engine", {"init_info": {}}, key=KEY)
        hidden.rename(remote_dir)
        assert status == 400 and "cannot be read" in text, text
        # finding 12: an NCCL backend's init_info is the caller's error too (400, not 500)
        status, text = _call(base + "/init_weight_transfer_engine",
                             {"init_info": {"master_address": "10.0.0.1", "master_port": 29500, "rank_offset": 1,
                                            "world_size": 2}}, key=KEY)
        assert status == 400 and "master_address" in text, text
        assert _keyed_probe(base, start_dir) == before  # nothing moved
        # the trainer: the server's remote (named or not) with the key
        status, text = _call(base + "/init_weight_transfer_engine", {"init_info": {"commit": trainer.first}}, key=KEY)
        assert status == 200, text
        # finding 10: a label that is not the commit the workers hold is refused, not reported
        status, text = _call(base + "/update_weight_version", {"new_version": "step-42"}, key=KEY)
        assert status != 200 and "refused" in text, text
        assert json.loads(_call(base + "/weight_info", key=KEY, method="GET")[1])["weight_version"] == trainer.first
        # finding 9: a wait for a new commit (update_info.timeout) does not hold up serving
        waited = {}

        def wait_for_a_commit():
            assert _call(base + "/start_weight_update", key=KEY)[0] == 200
            waited["answer"] = _call(base + "/update_weights", {"update_info": {"timeout": 120}}, key=KEY)

        waiting = threading.Thread(target=wait_for_a_commit)
        waiting.start()
        status, text = _call(base + "/v1/completions", {"model": str(start_dir), "prompt": "the cat", "max_tokens": 4,
                                                        "temperature": 0}, key=KEY)
        assert status == 200 and waiting.is_alive(), "a completion waited for the weight update's wait"
        moved = trainer.step(["model.layers.1.self_attn.k_proj.weight"])
        waiting.join(300)
        assert waited["answer"][0] == 200, waited
        assert _call(base + "/finish_weight_update", {"weight_version": moved}, key=KEY)[0] == 200
        assert json.loads(_call(base + "/weight_info", key=KEY, method="GET")[1])["weight_version"] == moved
        # issue 65: the next version is fetched while the server serves; the engine waits for the write only
        hold = tmp_path / "hold-the-fetch"
        hold.touch()
        fetched = trainer.step(["model.layers.0.mlp.up_proj.weight"])
        answer = {}

        def update():
            assert _call(base + "/start_weight_update", key=KEY)[0] == 200
            answer["update"] = _call(base + "/update_weights", {"update_info": {"commit": fetched}}, key=KEY)

        updating = threading.Thread(target=update)
        updating.start()
        _wait_for(tmp_path / "hold-the-fetch.held")  # the server's fetch is held...
        status, text = _call(base + "/v1/completions", {"model": str(start_dir), "prompt": "the cat", "max_tokens": 4,
                                                        "temperature": 0}, key=KEY, timeout=120)
        assert status == 200 and updating.is_alive(), "a completion waited for the update's fetch"  # ...and it serves
        assert json.loads(_call(base + "/weight_info", key=KEY, method="GET")[1])["weight_version"] == moved
        hold.unlink()
        updating.join(300)
        assert answer["update"][0] == 200, answer
        assert _call(base + "/finish_weight_update", {"weight_version": fetched}, key=KEY)[0] == 200
        assert json.loads(_call(base + "/weight_info", key=KEY, method="GET")[1])["weight_version"] == fetched
        # finding 12: init without a commit, then start and finish with no update: as vLLM's protocol has it
        assert _call(base + "/init_weight_transfer_engine", {"init_info": {}}, key=KEY)[0] == 200
        assert _call(base + "/start_weight_update", key=KEY)[0] == 200
        status, text = _call(base + "/finish_weight_update", {}, key=KEY)
        assert status == 200, text
        # finding 4: a write that fails midway
        (tmp_path / "fail-the-next-write").touch()
        commit = trainer.step(["model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.down_proj.weight"])
        assert _call(base + "/start_weight_update", key=KEY)[0] == 200
        status, text = _call(base + "/update_weights", {"update_info": {"commit": commit}}, key=KEY)
        assert status != 200 and "stopped midway" in text, text
        status, text = _call(base + "/v1/completions", {"model": str(start_dir), "prompt": "the cat", "max_tokens": 4,
                                                        "temperature": 0}, key=KEY)
        assert status != 200, "an engine holding parts of two versions answered a completion"
        assert _call(base + "/health", method="GET")[0] != 200
        status, text = _call(base + "/weight_info", key=KEY, method="GET")
        assert status == 200 and "unusable" in json.loads(text)["weight_version"], text


def test_a_server_started_without_its_remote_refuses_to_follow_one_a_caller_names(monkeypatch):
    from wvc.errors import WvcError
    from wvc.integrations.vllm.transfer import WvcInitInfo, followed

    with pytest.raises(WvcError, match="WVC_VLLM_REMOTE"):
        followed(WvcInitInfo(remote="hf://buckets/anyone/anything"), environ={})
    env = {"WVC_VLLM_REMOTE": "hf://team/policy", "WVC_VLLM_BRANCH": "run-1"}
    assert followed(WvcInitInfo(), environ=env) == ("hf://team/policy", "run-1")
    assert followed(WvcInitInfo(remote="hf://team/policy/", branch="run-1"), environ=env) == ("hf://team/policy",
                                                                                            "run-1")
    with pytest.raises(WvcError, match="run-1 only"):
        followed(WvcInitInfo(branch="main"), environ=env)
    with pytest.raises(WvcError, match="hf://team/policy only"):
        followed(WvcInitInfo(remote="hf://team/other"), environ=env)
