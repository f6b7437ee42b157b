"""One wvc operation in its own process, so the parent can read its time and peak RSS.

    python -m benchmarks.wvc_op commit REPO SRC_DIR [MESSAGE]
    python -m benchmarks.wvc_op checkout REPO REV OUT_DIR
    python -m benchmarks.wvc_op startup      # only the imports a commit and a checkout need
"""

import json
import os
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as the wvc command does (wvc/cli.py)

from wvc import Repo  # noqa: E402


def main(argv):
    op = argv[0]
    t, cpu = time.perf_counter(), time.process_time()
    if op == "startup":
        import blake3  # noqa: F401
        import zstandard  # noqa: F401

        import wvc.codec.transforms  # noqa: F401
        import wvc.ops.checkout  # noqa: F401
        import wvc.api  # noqa: F401  (the verbs)

        print(json.dumps({"seconds": time.perf_counter() - t}))
        return
    repo_path = argv[1]
    if op == "commit":
        repo = Repo.open(repo_path)
        res = repo.commit(argv[3] if len(argv) > 3 else "bench", source=argv[2], allow_empty=True)
        out = {"commit": res.commit, "stored_bytes": res.stored_bytes, "logical_bytes": res.logical_bytes}
    elif op == "checkout":
        repo = Repo.open(repo_path)
        res = repo.checkout(argv[2], output=argv[3], force=True)
        out = {"commit": res.commit}
    else:
        raise SystemExit(f"unknown op {op}")
    out["seconds"] = time.perf_counter() - t
    out["cpu_seconds"] = time.process_time() - cpu  # (the operation's own, every thread: no start-up)
    out["peak_rss_bytes"] = peak_rss()
    print(json.dumps(out))


def peak_rss() -> int:
    """This process's own peak RSS. (ru_maxrss is useless here: Linux carries it across
    fork and exec, so a child reports its parent's footprint at fork time.)"""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


if __name__ == "__main__":
    main(sys.argv[1:])
