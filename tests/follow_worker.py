"""A follower process for tests/test_trainer_commits.py: follows a branch until told to
stop, printing one JSON line per update (commit, bytes downloaded, a digest of its tensors).

    python -m tests.follow_worker URL BRANCH STOP_FILE
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from benchmarks.sync import digest  # the same digest the benchmark's follower reports


def main(url: str, branch: str, stop: Path) -> None:
    import wvc

    follower = wvc.follow(url, branch)
    while True:
        stopping = stop.exists()  # read before the update: the tip is final by then
        update = follower.update(timeout=0.5)  # waits for the first push too
        if update is not None:
            print(json.dumps({"commit": update.commit, "parent": update.parent,
                              "downloaded_bytes": update.downloaded_bytes,
                              "digest": digest(follower.state_dict)}), flush=True)
        elif stopping:
            return


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], Path(sys.argv[3]))
