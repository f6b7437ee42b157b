"""``wvc.integrations.trl.WvcWeightTransfer`` without a server: what it publishes (the start
version, then each sync as one step from TRL's stream), where it pushes, what it keeps,
and what a trainer hears when a server cannot be reached. With real vLLM servers and TRL's
trainer: tests_trl/."""

import socket

import pytest
import torch
from safetensors.torch import save_file

import wvc
from wvc.errors import WeightSyncError
from wvc.integrations.trl import WvcWeightTransfer


def _model_dir(path, seed=0):
    g = torch.Generator().manual_seed(seed)
    sd = {f"model.layers.{i}.weight": torch.randn(128, 96, generator=g).to(torch.bfloat16) for i in range(4)}
    path.mkdir(parents=True)
    save_file(sd, str(path / "model.safetensors"))
    (path / "config.json").write_text('{"model_type": "toy"}')
    return sd


def _trained(sd, step):
    g = torch.Generator().manual_seed(100 + step)
    return {k: v.float() + 1e-2 * torch.randn(v.shape, generator=g) for k, v in sd.items()}  # fp32 master


class _Trainer:
    """What a transfer reads of TRL's AsyncGRPOTrainer (``model_version``, ``state.global_step``),
    and what it hands send_weights: its ``_streaming_iter()`` generator."""

    def __init__(self, weights):
        self.weights, self.model_version = weights, 0
        self.state = type("State", (), {"global_step": 0})()

    def _streaming_iter(self):
        yield from self.weights.items()


def test_the_start_version_then_one_step_a_sync_with_trls_version_and_step(tmp_path):
    start = _model_dir(tmp_path / "start")
    remote = str(tmp_path / "remote")
    transfer = WvcWeightTransfer(remote, repo=tmp_path / "staging", start=tmp_path / "start")
    transfer.init_weight_transfer()
    first = transfer.start_commit
    assert wvc.open(remote, first).tree.by_path()["config.json"]  # the servers' files, published
    trainer = _Trainer(_trained(start, 1))
    transfer.bind_trainer(trainer)  # (what wvc's hook on AsyncGRPOTrainer.__init__ does)
    for step in (1, 2, 3):
        trainer.weights, trainer.state.global_step = _trained(start, step), step * 2
        transfer.send_weights(trainer._streaming_iter())
        trainer.model_version += 1
        transfer.wait()  # (the commit, push and loads run in the background)
        sync = transfer.syncs[-1]
        assert sync["model_version"] == step and sync["step"] == step * 2
        # one step, not the model: the bf16 weights of the step, coded against the start
        assert sync["uploaded_bytes"] < 0.9 * sync["logical_bytes"]
        got = wvc.open(remote, transfer.commit).state_dict()
        for k, v in trainer.weights.items():
            assert torch.equal(got[k].view(torch.int16), v.to(torch.bfloat16).view(torch.int16))
    log = wvc.Repo.open(tmp_path / "staging").log("main")
    assert [c.metadata.get("model_version") for c in log] == [3, 2, 1, None]
    assert (tmp_path / "staging" / "model.safetensors").exists() is False  # commits only: no working tree


def test_a_run_whose_local_repository_is_gone_goes_on_from_the_remote(tmp_path):
    start = _model_dir(tmp_path / "start")
    remote = str(tmp_path / "remote")
    a = WvcWeightTransfer(remote, repo=tmp_path / "a", start=tmp_path / "start")
    a.init_weight_transfer()
    began = a.start_commit
    synced = a.publish(_trained(start, 1), metadata={"step": 1})
    a.destroy()
    b = WvcWeightTransfer(remote, repo=tmp_path / "b", start=tmp_path / "start")
    b.init_weight_transfer()  # servers restarted from the start directory: the branch goes on from its tip
    assert wvc.open(remote, "main").commit == synced  # nothing published again
    assert (b.commit, b.resumed_from, b.start_commit) == (synced, synced, began)
    b.publish(_trained(start, 2), metadata={"step": 2})
    assert [c.metadata.get("step") for c in wvc.Repo.open(tmp_path / "b").log("main")] == [2, 1, None]


@pytest.mark.parametrize("staging", ["same", "gone"])
def test_a_restarted_run_does_not_publish_its_start_again_behind_the_servers_backs(tmp_path, staging, caplog):
    """Issue 64 finding 2: a run restarted on the same remote and branch with the same start=
    published the start version again as the branch's tip."""
    start = _model_dir(tmp_path / "start")
    remote = str(tmp_path / "remote")
    first = WvcWeightTransfer(remote, repo=tmp_path / "a", start=tmp_path / "start")
    first.init_weight_transfer()
    tip = first.publish(_trained(start, 1), metadata={"step": 1})
    first.destroy()
    again = WvcWeightTransfer(remote, repo=tmp_path / ("a" if staging == "same" else "b"), start=tmp_path / "start")
    with caplog.at_level("WARNING", logger="wvc.integrations.trl"):
        again.init_weight_transfer()
    assert wvc.open(remote, "main").commit == tip
    assert again.commit == tip and again.start_commit == first.start_commit
    assert any("goes on from it" in r.getMessage() for r in caplog.records)  # it says what it did
    commit = again.publish(_trained(start, 2), metadata={"step": 2})
    assert wvc.Repo.open(again.repo_path).read_commit(commit).parents == (tip,)


class _Answering:
    """A stand-in for a vLLM server's routes that answers every call with {} and names
    ``root`` as its model in /v1/models (what a hostile or misconfigured server may say)."""

    def __init__(self, root: str):
        import http.server
        import json
        import threading

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                body = {"data": [{"id": "m", "root": root}]} if self.path.startswith("/v1/models") else {}
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _answer

            def log_message(self, *_):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


class _TrainBeginCallback:
    """What calls init_weight_transfer in TRL: a callback holding the trainer as ``_trainer``."""

    def __init__(self, trainer):
        self._trainer = trainer

    def on_train_begin(self):
        self._trainer.weight_transfer.init_weight_transfer()


@pytest.mark.parametrize("with_trainer", [False, True])
def test_a_server_naming_another_directory_changes_nothing_that_is_published(tmp_path, with_trainer):
    """Issue 64 finding 5: the start version came from the directory the first server's
    /v1/models named, on the trainer's machine. Now it comes from start= or the trainer's own
    model, model files only."""
    secret = tmp_path / "home" / ".ssh"
    secret.mkdir(parents=True)
    (secret / "id_ed25519").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    server = _Answering(str(secret))
    try:
        remote = str(tmp_path / "remote")
        transfer = WvcWeightTransfer(remote, servers=[server.url], repo=tmp_path / "staging", timeout=5)
        if with_trainer:
            model = _model_dir(tmp_path / "trainer-model")
            (tmp_path / "trainer-model" / "notes.txt").write_text("not a model file")
            (tmp_path / "trainer-model" / ".env").write_text("AWS_SECRET_ACCESS_KEY=x")
            trainer = type("Trainer", (), {})()
            trainer.model = type("Model", (), {"name_or_path": str(tmp_path / "trainer-model")})()
            trainer.weight_transfer = transfer
            transfer.bind_trainer(trainer)
            _TrainBeginCallback(trainer).on_train_begin()
            files = set(wvc.open(remote, "main").files)
            assert files == {"model.safetensors", "config.json"}  # the trainer's model files, nothing else
            got = wvc.open(remote, "main").state_dict()
            assert all(torch.equal(got[k].view(torch.int16), v.view(torch.int16)) for k, v in model.items())
        else:
            transfer.init_weight_transfer()  # no start= and no trainer: nothing is published at init
            assert transfer.start_commit is None
            with pytest.raises(wvc.WvcError):
                wvc.open(remote, "main")
    finally:
        server.close()



def _closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"  # closed when the socket is: nothing listens


def test_a_server_that_cannot_be_reached_fails_the_sync_by_name_after_the_push(tmp_path):
    start = _model_dir(tmp_path / "start")
    remote = str(tmp_path / "remote")
    down = _closed_port()
    transfer = WvcWeightTransfer(remote, servers=[down], repo=tmp_path / "staging", start=tmp_path / "start",
                                 timeout=1.5)
    with pytest.raises(WeightSyncError, match=down) as info:  # init: the start version is pushed first
        transfer.init_weight_transfer()
    assert down in info.value.failures
    commit = transfer.publish(_trained(start, 1))
    with pytest.raises(WeightSyncError) as info:
        transfer.notify()
    assert info.value.commit == commit and list(info.value.failures) == [down]
    assert "deadline" in info.value.failures[down]
    assert wvc.open(remote, "main").commit == commit  # published: a server that comes back catches up


def test_keep_prunes_the_remote_as_the_run_goes(tmp_path):
    start = _model_dir(tmp_path / "start")
    remote = str(tmp_path / "remote")
    transfer = WvcWeightTransfer(remote, repo=tmp_path / "staging", start=tmp_path / "start", keep="last=2",
                                 prune_every=2)
    transfer.init_weight_transfer()
    for step in range(1, 7):
        transfer.publish(_trained(start, step), metadata={"step": step})
    assert transfer.prunes and sum(p["remote_pruned"] for p in transfer.prunes) >= 3
    log = wvc.Repo.open(tmp_path / "staging").log("main")
    tip = wvc.open(remote, "main").state_dict()
    want = _trained(start, 6)
    assert all(torch.equal(tip[k].view(torch.int16), want[k].to(torch.bfloat16).view(torch.int16)) for k in want)
    with pytest.raises(wvc.WvcError):  # a pruned step's weights are gone from the remote
        wvc.open(remote, log[3].id).state_dict()
    # issue 64 finding 11: the start version stays on the remote (a restarted server starts
    # at= it), byte for byte the start directory's weights
    assert log[-1].id == transfer.start_commit
    got = wvc.open(remote, transfer.start_commit).state_dict()
    assert all(torch.equal(got[k].view(torch.int16), v.view(torch.int16)) for k, v in start.items())
    follower = wvc.follow(remote, "main", state_dict={k: v.clone() for k, v in start.items()},
                          at=transfer.start_commit)
    assert follower.update().commit == transfer.commit


def test_each_sync_reaches_each_kind_of_remote_as_one_step(remote_url, request, tmp_path, monkeypatch):
    """A directory, a Hub repo (Xet and LFS), a Storage Bucket and S3: a server's follower,
    started at the start version, moves by each sync exactly, reading about what the sync
    stored (the follower's bound: 1.25x + 64 KB)."""
    if remote_url.startswith("hf://"):
        request.getfixturevalue("hub_env")
    monkeypatch.setenv("WVC_CACHE", str(tmp_path / "cache"))
    start = _model_dir(tmp_path / "start")
    transfer = WvcWeightTransfer(remote_url, repo=tmp_path / "staging", start=tmp_path / "start")
    transfer.init_weight_transfer()
    follower = wvc.follow(remote_url, "main", state_dict={k: v.clone() for k, v in start.items()},
                          at=transfer.start_commit)
    for step in (1, 2, 3):
        master = _trained(start, step)
        commit = transfer.publish(master, metadata={"step": step})
        up = follower.update(rev=commit)
        assert up.commit == commit
        assert up.downloaded_bytes <= 1.25 * transfer.syncs[-1]["stored_bytes"] + 65536, (step, up.downloaded_bytes)
        for k, v in master.items():
            assert torch.equal(follower.state_dict[k].view(torch.int16), v.to(torch.bfloat16).view(torch.int16))


def test_a_second_transfer_on_one_staging_repository_is_refused_in_one_line(tmp_path, monkeypatch):
    """Issue 64 finding 11: two transfers on one remote and branch shared one default staging
    repository; neither was refused and their versions interleaved."""
    monkeypatch.setenv("WVC_CACHE", str(tmp_path / "cache"))
    _model_dir(tmp_path / "start")
    remote = str(tmp_path / "remote")
    a = WvcWeightTransfer(remote, start=tmp_path / "start")
    a.init_weight_transfer()
    b = WvcWeightTransfer(remote, start=tmp_path / "start")
    with pytest.raises(wvc.WvcError, match="two trainers on one branch are refused"):
        b.init_weight_transfer()
    a.destroy()
    b.init_weight_transfer()  # the first one gone: the staging repository is free again
    b.destroy()


class _Misbehaving:
    """A server that answers every call with ``respond(handler)`` (raw writes)."""

    def __init__(self, respond):
        import http.server
        import threading

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self):
                self.body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                respond(self)

            do_GET = do_POST = _answer

            def log_message(self, *_):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def _drip(handler):
    """A byte at a time, forever: the status line, headers, then a body that never ends."""
    import time as _time

    try:
        for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b" " * 100000:
            handler.wfile.write(bytes([byte]))
            handler.wfile.flush()
            _time.sleep(0.2)  # (the misbehaviour under test: a server that drips)
    except OSError:
        pass


def test_a_call_to_a_server_that_answers_a_byte_at_a_time_ends_at_its_deadline():
    """Issue 64 finding 9: a per-read timeout let a dripping server hold notify(timeout=3)
    past 30 s; the deadline is now the call's total."""
    import time as _time

    from wvc.integrations.vllm.server_client import ServerError, VllmServer

    server = _Misbehaving(_drip)
    try:
        t0 = _time.monotonic()
        with pytest.raises(ServerError, match="deadline"):
            VllmServer(server.url, timeout=2).weight_version()
        assert _time.monotonic() - t0 < 8  # the drip alone would take over 5 hours
    finally:
        server.close()


def test_a_servers_error_text_reaches_the_trainer_as_one_short_printable_line(tmp_path):
    """Issue 64 finding 12: a server's error text, escapes and newlines included, was copied
    verbatim (2 KB) into WeightSyncError."""
    import json as _json

    def hostile(handler):
        body = _json.dumps({"error": {"message": "\x1b[2J\x1b[31mpwned\nline two\r\n" + "A" * 5000}}).encode()
        handler.send_response(400)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    server = _Misbehaving(hostile)
    try:
        _model_dir(tmp_path / "start")
        transfer = WvcWeightTransfer(str(tmp_path / "remote"), servers=[server.url], repo=tmp_path / "staging",
                                     start=tmp_path / "start", timeout=5)
        with pytest.raises(WeightSyncError) as info:
            transfer.init_weight_transfer()
        reason = info.value.failures[server.url]
        assert "pwned line two" in reason and "\x1b" not in reason and "\n" not in reason and len(reason) <= 400
        assert "\x1b" not in str(info.value) and len(str(info.value)) < 1000
    finally:
        server.close()


class _LoadingServer:
    """A stand-in for a wvc-backed vLLM server's weight routes: it holds the commit the last
    /update_weights named (reported by /weight_info) and records each; an update waits for
    ``gate`` (set: answer at once), and one naming a commit in ``refuse`` is a 500."""

    def __init__(self):
        import threading

        self.gate, self.loads, self.refuse, self.held = threading.Event(), [], set(), None
        self.waiting = threading.Event()  # an update is held at the gate
        self.gate.set()
        self.server = _Misbehaving(self._answer)
        self.url = self.server.url

    def _answer(self, handler):
        import json

        status, answer = 200, {}
        if handler.path == "/update_weights":
            commit = json.loads(handler.body)["update_info"]["commit"]
            self.waiting.set()
            self.gate.wait(60)
            if commit in self.refuse:
                status, answer = 500, {"error": {"message": "the step's objects cannot be read"}}
            else:
                self.held = commit
                self.loads.append(commit)
        elif handler.path == "/weight_info":
            answer = {"weight_version": self.held}
        data = json.dumps(answer).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def close(self):
        self.gate.set()
        self.server.close()


def _rollout_worker():
    """TRL's rollout worker, its model version (the one it tags rollouts with) and nothing
    else: no child process started."""
    import multiprocessing

    from trl.experimental.async_grpo.async_rollout_worker import AsyncRolloutWorker

    class RolloutWorker(AsyncRolloutWorker):
        def __init__(self):  # (TRL's starts the generation loop's process)
            self._model_version_value = multiprocessing.get_context("spawn").Value("i", 0)

    return RolloutWorker()


class _TrlTrainer(_Trainer):
    """Its sync as AsyncGRPOTrainer._sync_weight_merged runs it: pause, send, resume, then the
    version bumped and told to the rollout worker."""

    def __init__(self, weights, transfer):
        super().__init__(weights)
        self.rollout_worker, self.weight_transfer = _rollout_worker(), transfer
        transfer.bind_trainer(self)  # (what wvc's hook on AsyncGRPOTrainer.__init__ does)

    def sync_weight(self):
        self.weight_transfer.pause()
        self.weight_transfer.send_weights(self._streaming_iter())
        self.weight_transfer.resume()
        self.model_version += 1
        self.rollout_worker.update_model_version(self.model_version)


def _served_transfer(tmp_path, server: _LoadingServer, **options) -> WvcWeightTransfer:
    """A transfer from ``tmp_path/start`` (made by ``_model_dir``) to ``tmp_path/remote``
    whose one server is ``server``, initialized."""
    transfer = WvcWeightTransfer(str(tmp_path / "remote"), servers=[server.url], repo=tmp_path / "staging",
                                 start=tmp_path / "start", timeout=60, **options)
    transfer.init_weight_transfer()
    return transfer


def _bf16_equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k].view(torch.int16), b[k].to(torch.bfloat16).view(torch.int16))
                                        for k in a)


@pytest.mark.parametrize("master_dtype", [torch.float32, torch.bfloat16])  # cast into the snapshot, or copied as is
def test_send_weights_returns_with_a_snapshot_while_the_server_loads_and_rollouts_carry_what_it_holds(tmp_path,
                                                                                                     master_dtype):
    """Issue 65: the trainer is blocked for a snapshot only. send_weights returns while the
    server's load is held; the weights changed in place right after are not what is
    published; the rollout worker keeps the version the server holds until it holds the new
    one; a sync sent while one runs waits, and a newer one takes its place."""
    start = _model_dir(tmp_path / "start")
    server = _LoadingServer()
    try:
        transfer = _served_transfer(tmp_path, server)
        trainer = _TrlTrainer({k: v.to(master_dtype) for k, v in _trained(start, 1).items()}, transfer)
        sent = {k: v.clone() for k, v in trainer.weights.items()}
        server.gate.clear()
        trainer.sync_weight()  # returns with the load held at the server
        assert server.waiting.wait(60) and server.loads == [] and transfer.commit is not None
        assert trainer.rollout_worker.model_version == 0  # the server still holds version 0
        for v in trainer.weights.values():
            v.add_(1.0)  # the optimizer's next step, in place
        second = {k: v.clone() for k, v in trainer.weights.items()}
        trainer.sync_weight()  # waits behind the first...
        for v in trainer.weights.values():
            v.add_(1.0)
        third = {k: v.clone() for k, v in trainer.weights.items()}
        trainer.sync_weight()  # ...and is superseded by this one
        assert trainer.model_version == 3 and trainer.rollout_worker.model_version == 0
        server.gate.set()
        transfer.wait()
        assert transfer.superseded == 1
        published = [s["commit"] for s in transfer.syncs]
        assert server.loads == published and len(published) == 2
        assert _bf16_equal(wvc.open(str(tmp_path / "remote"), published[0]).state_dict(), sent)
        assert _bf16_equal(wvc.open(str(tmp_path / "remote"), published[1]).state_dict(), third)
        assert not _bf16_equal(third, second)
        assert [s["model_version"] for s in transfer.syncs] == [1, 3]
        assert trainer.rollout_worker.model_version == 3  # the server holds version 3 now
        assert all(s["snapshot_s"] >= 0 and s["done_s"] >= s["queued_s"] for s in transfer.syncs)
        transfer.destroy()
    finally:
        server.close()


def test_a_background_sync_that_fails_is_raised_by_the_next_send_and_by_wait(tmp_path):
    start = _model_dir(tmp_path / "start")
    server = _LoadingServer()
    try:
        transfer = _served_transfer(tmp_path, server)
        trainer = _TrlTrainer(_trained(start, 1), transfer)
        server.gate.clear()
        trainer.sync_weight()
        assert server.waiting.wait(60)
        server.refuse.add(transfer.commit)  # this sync's load fails at the server
        server.gate.set()
        with pytest.raises(WeightSyncError) as failed:
            transfer.wait()
        assert list(failed.value.failures) == [server.url] and "cannot be read" in failed.value.failures[server.url]
        assert trainer.rollout_worker.model_version == 0  # the server never held version 1
        server.refuse.clear()
        trainer.weights = _trained(start, 2)
        trainer.sync_weight()  # the failure was heard (by wait): this one goes on
        transfer.wait()
        assert server.held == transfer.commit and trainer.rollout_worker.model_version == 2
        server.gate.clear()
        server.waiting.clear()
        trainer.weights = _trained(start, 3)
        trainer.sync_weight()
        assert server.waiting.wait(60)
        server.refuse.add(transfer.commit)
        server.gate.set()
        transfer._queue._thread.join(60)  # the failed sync has ended, unheard
        with pytest.raises(WeightSyncError):  # heard at the next call, as a blocking sync's would be
            trainer.sync_weight()
        transfer.destroy()
    finally:
        server.close()


def test_a_background_sync_takes_no_tensor_while_the_trainer_snapshots():
    """The trainer's blocked time is its snapshot's own work: the sync running in the
    background (its commit taking the last snapshot's tensors one by one) waits while the
    trainer holds the foreground, then goes on where it was. Measured without it
    (benchmarks/trainer_blocked.py), the snapshots' slowest was 6-16x their median: the
    commit's threads had the CPUs."""
    import threading

    from wvc.integrations.sync_queue import SyncQueue
    from wvc.integrations.trl import _drain

    queue = SyncQueue("test-sync")
    snapshot = {f"t{i}": torch.full((4,), float(i)) for i in range(6)}
    taken, one_taken, next_asked, go_on = [], threading.Event(), threading.Event(), threading.Event()

    def job():
        pairs = _drain(snapshot, queue)
        taken.append(next(pairs))
        one_taken.set()
        go_on.wait(60)
        next_asked.set()
        taken.extend(pairs)

    queue.submit(job)
    assert one_taken.wait(60)
    with queue.foreground():
        go_on.set()
        assert next_asked.wait(60)
        assert not queue.wait(0.5) and len(taken) == 1 and len(snapshot) == 5  # paused at the next tensor
    assert queue.wait(60)
    assert [name for name, _ in taken] == [f"t{i}" for i in range(6)] and snapshot == {}
    assert all(torch.equal(t, torch.full((4,), float(i))) for i, (_, t) in enumerate(taken))


@pytest.mark.parametrize("background", [True, False])
def test_a_sync_prunes_only_once_its_servers_hold_the_version(tmp_path, background):
    """keep= prunes the staging repository and the remote every few syncs (6-8 s at 74M):
    after the servers hold the sync's version, not between its push and their load, where
    every server (and, blocking, the trainer) waited for it (issue 65)."""
    start = _model_dir(tmp_path / "start")
    server = _LoadingServer()
    try:
        transfer = _served_transfer(tmp_path, server, keep="last=2", prune_every=1, background=background)
        events, real_prune = [], transfer.prune

        def prune():
            events.append(("prune", transfer.commit, server.held))
            return real_prune()

        transfer.prune = prune
        trainer = _TrlTrainer(_trained(start, 1), transfer)
        for step in range(1, 4):
            trainer.weights = _trained(start, step)
            trainer.sync_weight()
            transfer.wait()
        assert len(events) == 3 and all(held == commit for _, commit, held in events), events
        assert server.loads == [s["commit"] for s in transfer.syncs]
        transfer.destroy()
    finally:
        server.close()


def test_trls_trainer_hands_itself_to_its_wvc_transfer_and_its_own_first_sync_carries_its_version(tmp_path,
                                                                                                 monkeypatch):
    """Issue 67: the transfer found TRL's trainer by reading its callers' frames (the train-begin
    callback's ``self``, the ``_streaming_iter`` generator's). A real AsyncGRPOTrainer built with
    the transfer now hands itself over (integrations/trl_hooks.py); TRL's own train-begin
    callback then publishes the trainer's model as the start and syncs it with TRL's model
    version and step. (The rollout worker is a stand-in: TRL's starts vLLM's generation loop.)"""
    from datasets import Dataset
    from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer, async_grpo_trainer

    from tests_vllm import models

    # (TRL's __init__ asks CUDA for its MFU metric; None is what it handles: tests_vllm/trl_on_cpu.py)
    monkeypatch.setattr(async_grpo_trainer, "get_peak_flops_per_device", lambda accelerator, dtype: None)
    start = models.build(tmp_path / "start", tied=True, dtype=torch.bfloat16)

    class RolloutWorker:
        rollout_buffer = None
        versions: list = []

        def start(self):
            pass

        def stop(self):
            pass

        def update_model_version(self, version):
            self.versions.append(version)

    def trainer_with(transfer):
        return AsyncGRPOTrainer(model=str(tmp_path / "start"), reward_funcs=lambda completions, **_: [0.0] * len(completions),
                                args=AsyncGRPOConfig(output_dir=str(tmp_path / "out"), report_to=[], bf16=False, max_steps=1,
                                                     per_device_train_batch_size=4, num_generations=4),
                                train_dataset=Dataset.from_dict({"prompt": ["a b"] * 8}), weight_transfer=transfer,
                                rollout_worker=RolloutWorker())

    transfer = WvcWeightTransfer(str(tmp_path / "remote"), repo=tmp_path / "staging")
    trainer = trainer_with(transfer)
    assert transfer.trainer is trainer
    other = WvcWeightTransfer(str(tmp_path / "other"), repo=tmp_path / "other-staging")
    assert trainer_with(_NoTransfer()).weight_transfer.__class__ is _NoTransfer and other.trainer is None
    train_begin = next(c for c in trainer.callback_handler.callbacks if type(c).__name__ == "_TrainBeginCallback")
    train_begin.on_train_begin(trainer.args, trainer.state, trainer.control)  # init, then TRL's first sync
    transfer.wait()
    try:
        assert transfer.start_commit is not None  # the trainer's own model, found through it
        assert [(s["model_version"], s["step"]) for s in transfer.syncs] == [(1, 0)]
        got = wvc.open(str(tmp_path / "remote"), "main").state_dict()
        assert got.keys() == start.keys()
        assert all(torch.equal(got[k].view(torch.int16), v.view(torch.int16)) for k, v in start.items())
    finally:
        transfer.destroy()
        other.destroy()


class _NoTransfer:
    """A weight transfer of TRL's protocol that is not wvc's: the hook leaves it alone."""

    def init_weight_transfer(self):
        pass

    def pause(self):
        pass

    def send_weights(self, iterator):
        for _ in iterator:
            pass

    def resume(self):
        pass

    def destroy(self):
        pass
