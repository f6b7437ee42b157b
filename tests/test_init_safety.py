"""`wvc init` never touches an existing repository, and a database that cannot be read is
reported as what it is (locked, unreadable, damaged), never as a half-made repository
(issue 37, finding 1: init wiped a healthy history while another process held the lock)."""

import os
import subprocess
import sys
import textwrap

import pytest

from .conftest import repo_state
from .test_everyday import run

HOLD_LOCK = textwrap.dedent("""
    import sqlite3, sys
    conn = sqlite3.connect(sys.argv[1])
    conn.execute("PRAGMA locking_mode=EXCLUSIVE")
    conn.execute("BEGIN EXCLUSIVE")
    print("locked", flush=True)
    sys.stdin.read()  # held until the test closes our stdin
""")


@pytest.fixture
def committed(tmp_path):
    root = tmp_path / "model"
    root.mkdir()
    (root / "config.json").write_text('{"a": 1}')
    run(root, "init")
    run(root, "commit", "-m", "one")
    return root


def test_init_and_status_under_another_process_lock_say_locked_and_keep_history(committed):
    before = repo_state(committed)
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(committed / ".wvc" / "wvc.db")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        status = run(committed, "status", check=False)
        init = run(committed, "init", check=False)
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    for r in (status, init):
        assert r.returncode != 0
        assert "locked by another process" in r.stderr, r.stderr
        assert "interrupted" not in r.stderr and "Traceback" not in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
    assert "Initialized" not in init.stdout
    assert repo_state(committed) == before
    assert "one" in run(committed, "log", "--oneline").stdout


def test_a_damaged_database_is_reported_and_init_refuses_it(committed):
    db = committed / ".wvc" / "wvc.db"
    saved = db.read_bytes()
    with open(db, "r+b") as f:  # the first page's header
        f.write(b"this is not an sqlite header at all")
    damaged = db.read_bytes()
    for verb in ("status", "init"):
        r = run(committed, verb, check=False)
        assert r.returncode != 0
        assert "damaged" in r.stderr and "fsck" in r.stderr, r.stderr
        assert "interrupted" not in r.stderr and "Traceback" not in r.stderr
    assert db.read_bytes() == damaged  # nothing replaced it
    assert len(list((committed / ".wvc" / "packs").glob("pack-*"))) > 0
    db.write_bytes(saved)
    assert "one" in run(committed, "log", "--oneline").stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a command as another user")
def test_a_database_this_user_cannot_read_is_permission_denied(committed):
    import pwd

    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user 'nobody'")
    os.chmod(committed / ".wvc" / "wvc.db", 0o600)
    os.chmod(committed, 0o755)
    os.chmod(committed.parent, 0o755)
    os.chmod(committed / ".wvc", 0o755)
    before = repo_state(committed)
    env = {**os.environ, "HOME": "/tmp"}
    try:
        subprocess.run([sys.executable, "-c", "import wvc"], env=env, user=nobody.pw_uid, group=nobody.pw_gid,
                       cwd="/", check=True, capture_output=True, timeout=120)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("this Python or wvc cannot be run by 'nobody' (installed under a private home)")
    for verb in ("status", "init"):
        r = subprocess.run([sys.executable, "-m", "wvc", verb], cwd=committed, capture_output=True, text=True,
                           env=env, user=nobody.pw_uid, group=nobody.pw_gid, timeout=120)
        assert r.returncode != 0
        assert ("permission denied" in r.stderr or "already holds" in r.stderr), r.stderr
        assert "interrupted" not in r.stderr and "Traceback" not in r.stderr
    assert repo_state(committed) == before


def test_init_in_an_existing_repository_refuses(committed):
    before = repo_state(committed)
    r = run(committed, "init", check=False)
    assert r.returncode != 0 and "already holds a wvc repository" in r.stderr
    assert repo_state(committed) == before
