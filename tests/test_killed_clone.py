"""A clone killed while its repository is being made is recognised and redone by the next
`wvc clone` into the same directory (issue 37, finding 22: it left only `.wvc-tmp-init-*/`,
and the rerun said `destination exists and is not an empty directory`)."""

import os
import subprocess
import sys
import textwrap

import pytest

from wvc import Repo

from .conftest import tree_digests
from .test_everyday import run, two_tensors

KILL_IN_INIT = textwrap.dedent("""
    import os, signal, sys
    real_rename = os.rename
    def rename(src, dst, *a, **k):
        if os.path.basename(str(src)).startswith(".wvc-tmp-init-"):
            os.kill(os.getpid(), signal.SIGKILL)  # as a user's Ctrl-\\ or the OOM killer would
        return real_rename(src, dst, *a, **k)
    os.rename = rename
    from wvc import clone
    clone(sys.argv[1], sys.argv[2], lazy=sys.argv[3] == "lazy")
""")


def _pushed(tmp_path) -> Repo:
    src = Repo.init(tmp_path / "src")
    two_tensors(src.root / "model.safetensors")
    src.commit("one")
    src.remote_add("origin", str(tmp_path / "remote"))
    src.push()
    return src


@pytest.mark.parametrize("mode", ["plain", "lazy"])
def test_a_clone_killed_while_making_its_repository_is_redone(tmp_path, mode):
    src = _pushed(tmp_path)
    dest = tmp_path / "dest"
    r = subprocess.run([sys.executable, "-c", KILL_IN_INIT, str(tmp_path / "remote"), str(dest), mode],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == -9
    left = [p.name for p in dest.iterdir()]
    assert left and all(n.startswith(".wvc-tmp-init-") for n in left), left
    args = ["clone", "--lazy"] if mode == "lazy" else ["clone"]
    run(tmp_path, *args, tmp_path / "remote", dest)
    assert [p.name for p in dest.iterdir() if p.name.startswith(".wvc-tmp")] == []
    assert tree_digests(dest) == tree_digests(src.root)
    with Repo.open(dest) as copy:
        assert copy.head() == src.head()


def test_a_directory_with_the_users_files_is_still_refused(tmp_path):
    src = _pushed(tmp_path)
    dest = tmp_path / "dest"
    (dest / ".wvc-tmp-init-x").mkdir(parents=True)
    (dest / "mine.txt").write_text("keep")
    r = run(tmp_path, "clone", tmp_path / "remote", dest, check=False)
    assert r.returncode == 1 and "not an empty directory" in r.stderr
    assert (dest / "mine.txt").read_text() == "keep"
