"""A clone's memory does not grow with the model: fetch verification streams, keeping
decoded delta bases in a bounded cache (remotes/downloads.py). ``python -m
benchmarks.clone_memory`` gives the 600 MB figures against a checkout; this measures the
growth between two model sizes, which a verifier that kept every decoded base would show
as the size of the first version."""

from pathlib import Path

from benchmarks.clone_memory import measure


def test_clone_peak_rss_does_not_grow_with_the_model(tmp_path: Path):
    small = measure(tmp_path / "small", 32)
    large = measure(tmp_path / "large", 128)
    assert small["byte_identical"] and large["byte_identical"]
    grew = large["clone_peak_rss_mb"] - small["clone_peak_rss_mb"]
    # A verifier that kept its decoded bases would grow by about the whole difference (96 MB).
    # What does vary between the two runs is fixed per thread: which codec threads took their
    # chunk-sized work buffers and which malloc arenas kept freed chunks, measured at -2 to
    # +22 MB over repeated pairs of runs (with the code of 924fd76 too), so the bound is half
    # the difference; it was a quarter, which those runs crossed now and then.
    assert grew < 0.5 * (large["model_mb"] - small["model_mb"]), (small, large)
    assert large["clone_peak_rss_mb"] < 300, large
