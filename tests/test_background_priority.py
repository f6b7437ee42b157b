"""Work no one waits on runs at a lower CPU priority (codec/pool.py): a thread marked with
work_in_background() is niced, and its codec work runs on niced threads, while the caller's
own codec work keeps the process's priority. The threads wvc starts for such work (a sync
queue's worker, a Publisher's committer and pusher) are marked."""

import os
import sys
import threading

import pytest
import torch

from wvc.codec import pool as codec_pool

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values are Linux's")


def nice_of_this_thread() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def test_a_background_threads_codec_work_runs_niced_and_the_callers_does_not():
    base = os.getpriority(os.PRIO_PROCESS, os.getpid())
    assert base + codec_pool.background_nice() <= 19, "this process is niced too far for the test to see anything"
    got = {}

    def background():
        codec_pool.work_in_background()
        got["thread"] = nice_of_this_thread()
        got["pool"] = codec_pool.pool().submit(nice_of_this_thread).result()
        got["pool thread"] = codec_pool.pool().submit(threading.current_thread).result().name

    t = threading.Thread(target=background)
    t.start()
    t.join()
    assert got["thread"] == got["pool"] == base + codec_pool.background_nice(), got
    assert got["pool thread"].startswith("wvc-codec-bg")
    # the caller's (foreground) work, after the background pool exists: the process's priority
    assert codec_pool.pool().submit(nice_of_this_thread).result() == base
    assert nice_of_this_thread() == base


def test_a_background_nice_of_zero_leaves_priorities_alone(monkeypatch):
    monkeypatch.setenv("WVC_BACKGROUND_NICE", "0")
    base = os.getpriority(os.PRIO_PROCESS, os.getpid())
    got = []
    t = threading.Thread(target=lambda: (codec_pool.work_in_background(), got.append(nice_of_this_thread())))
    t.start()
    t.join()
    assert got == [base]
    monkeypatch.setenv("WVC_BACKGROUND_NICE", "25")
    with pytest.raises(ValueError, match="WVC_BACKGROUND_NICE"):
        codec_pool.background_nice()


def test_the_sync_queues_worker_and_the_publishers_threads_work_in_the_background(tmp_path, monkeypatch):
    from wvc.integrations.publisher import Publisher
    from wvc.integrations.sync_queue import SyncQueue
    import wvc.codec as codec

    seen = {}
    queue = SyncQueue()
    queue.submit(lambda: seen.setdefault("sync queue", (codec_pool.in_background(), nice_of_this_thread())))
    queue.wait()
    real_encode = codec.encode

    def encode(*args, **kwargs):  # a commit's codec work, on whichever thread runs it
        seen.setdefault(threading.current_thread().name, nice_of_this_thread())
        return real_encode(*args, **kwargs)

    monkeypatch.setattr(codec, "encode", encode)
    pub = Publisher(tmp_path / "repo", "main", push_to=str(tmp_path / "remote"), push_interval=0)
    pub.publish({"w": torch.randn(1 << 16).to(torch.bfloat16)}, message="one", wait=True)
    assert pub.close(timeout=60), pub.errors
    base = os.getpriority(os.PRIO_PROCESS, os.getpid())
    low = base + codec_pool.background_nice()
    assert seen.pop("sync queue") == (True, low)
    assert seen and all(name.startswith("wvc-codec-bg") and nice == low for name, nice in seen.items()), seen
