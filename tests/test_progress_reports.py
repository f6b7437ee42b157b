"""Progress a user can read (issue 37, finding 12): a push reports its upload, and the CLI's
bar shows bytes done, the total and a rate for byte phases, a count for others."""

import io

from wvc import Repo
from wvc.progress import Progress

from .test_everyday import two_tensors


class Recorder(Progress):
    def __init__(self):
        self.phases = []

    def start(self, total, label, unit="bytes"):
        self.phases.append([label, total, unit, 0])

    def advance(self, n):
        self.phases[-1][3] += n


def test_a_push_reports_its_upload_in_bytes(tmp_path, remote_url, hub_env):
    repo = Repo.init(tmp_path / "a")
    two_tensors(repo.root / "model.safetensors")
    repo.commit("one")
    repo.remote_add("origin", remote_url)
    rec = Recorder()
    res = repo.push(progress=rec)
    (upload,) = [p for p in rec.phases if p[0] == "uploading"]
    assert upload[2] == "bytes" and upload[1] == upload[3] > 0
    assert upload[1] >= res.uploaded_bytes * 0.9  # refs and the card are a few bytes on top


def test_the_bar_shows_bytes_rate_and_counts(monkeypatch):
    from wvc import cli

    err = io.StringIO()
    err.isatty = lambda: True
    monkeypatch.setattr(cli.sys, "stderr", err)
    bar = cli.BarProgress()
    bar.start(3_000_000, "commit")
    bar.advance(1_500_000)
    assert bar._detail(None).startswith("1.5 MB/3.0 MB ") and bar._detail(None).endswith("/s")
    bar.close()
    bar.start(4, "downloading base files", unit="files")
    bar.advance(1)
    assert bar._detail(None) == "1/4 files"
    bar.close()


def test_a_publishers_background_push_keeps_huggingface_hubs_bars_out_and_restores_them(tmp_path, hub_env,
                                                                                          capfd):
    """Finding 12: huggingface_hub's upload bars from a background push landed in the training
    log. They are off while a Publisher's push runs, and the caller's setting is put back."""
    import torch
    import importlib

    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    hf_tqdm = importlib.import_module("huggingface_hub.utils.tqdm")

    from wvc.integrations.publisher import Publisher

    enable_progress_bars()
    disable_progress_bars("some.group.of.the.user")  # a setting of the user's own, to be kept
    before = dict(hf_tqdm.progress_bar_states)
    seen_during = []
    real_push = Repo.push

    def push(self, *a, **k):
        seen_during.append(are_progress_bars_disabled())
        return real_push(self, *a, **k)

    import pytest

    mp = pytest.MonkeyPatch()
    mp.setattr(Repo, "push", push)
    try:
        pub = Publisher(tmp_path / "run", "run/a", push_to=f"hf://team/bars-{tmp_path.name}", push_interval=0)
        for step in range(2):
            pub.publish({"w": torch.randn(512, 512) + step}, message=f"step {step}")
        assert pub.close(timeout=120) and not pub.errors
    finally:
        mp.undo()
    err = capfd.readouterr().err
    assert seen_during and all(seen_during)
    assert "it/s]" not in err and "B/s]" not in err and "Upload" not in err, err[-2000:]
    assert dict(hf_tqdm.progress_bar_states) == before and not are_progress_bars_disabled()
    enable_progress_bars()
