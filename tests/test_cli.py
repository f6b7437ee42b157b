"""The command line: every verb, --json output, one-line errors, and no torch for fast commands."""

import json
import os
import subprocess
import sys

import click
import pytest
import torch
from safetensors.torch import save_file

from wvc import Repo
from wvc.cli import main

from .conftest import repo_state, write_raw_safetensors


@pytest.fixture
def model_dir(tmp_path, cli):
    root = tmp_path / "m"
    root.mkdir()
    save_file({"w": torch.randn(64, 64).to(torch.bfloat16)}, str(root / "model.safetensors"))
    (root / "config.json").write_text("{}")
    assert cli(root, "init").exit_code == 0
    r = cli(root, "commit", "-m", "first", "--json")
    assert r.exit_code == 0, r.output
    return root


def test_commit_json_reports_sizes(model_dir, cli):
    save_file({"w": torch.randn(64, 64).to(torch.bfloat16)}, str(model_dir / "model.safetensors"))
    r = cli(model_dir, "commit", "-m", "second", "--meta", "step=2", "--json")
    out = json.loads(r.output)
    assert {"commit", "logical_bytes", "stored_bytes"} <= set(out)
    assert out["logical_bytes"] == os.path.getsize(model_dir / "model.safetensors") + 2
    show = json.loads(cli(model_dir, "show", "HEAD", "--json").output)
    assert show["commit"] == out["commit"] and show["metadata"] == {"step": 2}


def test_log_status_branch_tag_and_revs(model_dir, cli):
    first = json.loads(cli(model_dir, "log", "--json").output)["commits"][0]["commit"]
    (model_dir / "config.json").write_text('{"a": 1}')
    assert json.loads(cli(model_dir, "status", "--json").output)["modified"] == ["config.json"]
    second = json.loads(cli(model_dir, "commit", "-m", "two", "--json").output)["commit"]
    assert cli(model_dir, "branch", "exp", "HEAD~1").exit_code == 0
    assert cli(model_dir, "tag", "v1", first[:8]).exit_code == 0
    branches = json.loads(cli(model_dir, "branch", "--json").output)
    assert branches["branches"] == {"exp": first, "main": second} and branches["current"] == "main"
    assert json.loads(cli(model_dir, "tag", "--json").output)["tags"] == {"v1": first}
    oneline = cli(model_dir, "log", "--oneline").output.splitlines()
    assert oneline[0].startswith(second[:12]) and "HEAD -> main" in oneline[0]
    assert len(cli(model_dir, "log", "-n", "1", "--oneline").output.splitlines()) == 1
    graph = cli(model_dir, "log", "--graph", "--oneline", "--all").output
    assert graph.splitlines()[0].startswith("*")
    for rev in ("v1", "main~1", "HEAD^", first[:6], "exp"):
        assert json.loads(cli(model_dir, "show", rev, "--json").output)["commit"] == first
    r = cli(model_dir, "checkout", "exp", "--json")
    assert json.loads(r.output)["branch"] == "exp"
    assert cli(model_dir, "branch", "-d", "exp").exit_code == 1  # checked out
    cli(model_dir, "checkout", "main")
    assert cli(model_dir, "branch", "-d", "exp").exit_code == 0


def test_diff_reports_per_tensor_statistics(model_dir, cli):
    w = torch.zeros(64, 64)
    w[0, :4] = 1.0
    save_file({"w": w.to(torch.bfloat16)}, str(model_dir / "model.safetensors"))
    cli(model_dir, "commit", "-m", "a")
    w[0, 0] = 3.0
    save_file({"w": w.to(torch.bfloat16)}, str(model_dir / "model.safetensors"))
    work = json.loads(cli(model_dir, "diff", "--json").output)  # HEAD vs working tree
    (t,) = work["tensors"]
    assert (t["name"], t["changed"], t["max_abs_delta"]) == ("w", 1, 2.0)
    assert t["rel_l2"] == pytest.approx(2.0 / 2.0)  # |delta| = 2, |a| = sqrt(4)
    cli(model_dir, "commit", "-m", "b")
    (t2,) = json.loads(cli(model_dir, "diff", "HEAD~1", "HEAD", "--json").output)["tensors"]
    assert t2["changed"] == 1 and t2["stored_bytes"] > 0
    stat = json.loads(cli(model_dir, "diff", "HEAD~1", "HEAD", "--stat", "--json").output)
    assert stat["tensors"] == [] and stat["files"][0]["path"] == "model.safetensors"
    assert "w" in cli(model_dir, "diff", "HEAD~1", "HEAD").output


def test_stats_gc_fsck_demo_json(model_dir, cli):
    s = json.loads(cli(model_dir, "stats", "--json").output)
    assert s["commits"] == 1 and s["stored_bytes"] > 0
    assert json.loads(cli(model_dir, "fsck", "--json").output)["ok"] is True
    assert cli(model_dir, "gc", "--json", "--grace", "0").exit_code == 0


def one_line_error(result):
    assert result.exit_code != 0
    lines = [l for l in result.output.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("wvc: error:"), result.output
    assert "Traceback" not in result.output
    return lines[0]


BAD_FILES = {
    "huge header length": dict(header=b"{}", header_len=2**62),
    "truncated header": dict(header=b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', header_len=500),
    "overlapping offsets": dict(header={"a": {"dtype": "I8", "shape": [4], "data_offsets": [0, 4]},
                                        "b": {"dtype": "I8", "shape": [4], "data_offsets": [2, 6]}}, data=bytes(6)),
    "bad dtype": dict(header={"a": {"dtype": "Q7", "shape": [1], "data_offsets": [0, 1]}}, data=b"x"),
    "shape size mismatch": dict(header={"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 4]}}, data=bytes(4)),
    "duplicate names": dict(header=b'{"a":{"dtype":"I8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"I8","shape":[1],"data_offsets":[1,2]}}', data=b"xy"),
    "invalid json": dict(header=b'{"a": [1, 2', data=b""),
    "truncated data": dict(header={"a": {"dtype": "F32", "shape": [100], "data_offsets": [0, 400]}}, data=bytes(10)),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_malformed_safetensors_is_refused_and_repo_unchanged(model_dir, cli, case):
    write_raw_safetensors(model_dir / "bad.safetensors", **BAD_FILES[case])
    before = repo_state(model_dir)
    line = one_line_error(cli(model_dir, "commit", "-m", "bad"))
    assert "bad.safetensors" in line
    assert repo_state(model_dir) == before
    assert not [p for p in (model_dir / ".wvc" / "packs").iterdir() if p.name.startswith(".wvc-tmp")]


@pytest.mark.parametrize(
    "args",
    [("show", "nope"), ("checkout", "deadbeef"), ("log", "HEAD~5"), ("diff", "x", "HEAD"),
     ("branch", "bad..name"), ("branch", "has space"), ("branch", "-lead"), ("tag", "a:b"), ("branch", "x.lock")],
)
def test_bad_revisions_and_names_are_one_line_errors(model_dir, cli, args):
    before = repo_state(model_dir)
    one_line_error(cli(model_dir, *args))
    assert repo_state(model_dir) == before


def test_outside_a_repository(tmp_path, cli):
    for args in (("status",), ("log",), ("commit", "-m", "x")):
        assert "not a wvc repository" in one_line_error(cli(tmp_path, *args))


def test_checkout_refuses_to_overwrite_uncommitted_work(model_dir, cli):
    save_file({"w": torch.ones(64, 64).to(torch.bfloat16)}, str(model_dir / "model.safetensors"))
    cli(model_dir, "commit", "-m", "two")
    (model_dir / "model.safetensors").write_bytes(b"precious unsaved work")
    before = repo_state(model_dir)
    assert "uncommitted" in one_line_error(cli(model_dir, "checkout", "HEAD~1"))
    assert repo_state(model_dir) == before
    assert (model_dir / "model.safetensors").read_bytes() == b"precious unsaved work"
    assert cli(model_dir, "checkout", "HEAD~1", "--force").exit_code == 0


def test_checkout_head_restores_files_and_stays_on_the_branch(model_dir, cli):
    committed = (model_dir / "model.safetensors").read_bytes()
    (model_dir / "model.safetensors").write_bytes(b"a broken edit")
    assert cli(model_dir, "checkout", "HEAD", "--force").exit_code == 0
    assert (model_dir / "model.safetensors").read_bytes() == committed
    with Repo.open(model_dir) as repo:
        assert repo.head_branch() == "main"
    save_file({"w": torch.zeros(64, 64).to(torch.bfloat16)}, str(model_dir / "model.safetensors"))
    assert cli(model_dir, "commit", "-m", "after").exit_code == 0
    with Repo.open(model_dir) as repo:  # the commit moved the branch, not a detached HEAD
        assert repo.read_commit(repo.resolve("main")).message == "after"


@pytest.mark.parametrize("given, expected", [(None, "1"), ("3", "3")])
def test_the_command_keeps_numpys_blas_to_one_thread_unless_told(given, expected):
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if given is not None:
        env["OPENBLAS_NUM_THREADS"] = given
    probe = "import os, wvc.cli, numpy; print(os.environ['OPENBLAS_NUM_THREADS'])"
    r = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == expected, r.stderr


def test_every_command_has_help():
    def walk(cmd, path):
        yield path, cmd
        if isinstance(cmd, click.Group):
            for name, sub in cmd.commands.items():
                yield from walk(sub, path + [name])

    for path, cmd in walk(main, []):
        assert (cmd.help or "").strip(), f"wvc {' '.join(path)} has no help"
        ctx = click.Context(cmd, info_name="wvc")
        assert cmd.get_help(ctx)


PROBE = """
import runpy, sys
sys.argv = ["wvc", *sys.argv[1:]]
try:
    runpy.run_module("wvc", run_name="__main__")
except SystemExit as e:
    code = e.code
heavy = [m for m in ("torch", "transformers", "huggingface_hub") if m in sys.modules]
print("HEAVY:" + ",".join(heavy))
"""


@pytest.mark.parametrize("args", [["--help"], ["log"], ["status"], ["log", "--oneline", "--graph"]])
def test_fast_commands_do_not_import_torch(model_dir, args):
    r = subprocess.run([sys.executable, "-c", PROBE, *args], cwd=model_dir, capture_output=True, text=True, timeout=60)
    assert r.stdout.strip().splitlines()[-1] == "HEAVY:", r.stdout + r.stderr


def test_a_commit_names_its_author_without_importing_socket(model_dir, monkeypatch):
    """user@host, as socket.gethostname() names the host, from uname: importing socket cost
    every commit ~3 ms (a small model's whole commit is ~0.2 s)."""
    import getpass
    import socket

    from wvc.ops.commit import default_author

    monkeypatch.delenv("WVC_AUTHOR", raising=False)
    assert default_author() == f"{getpass.getuser()}@{socket.gethostname()}"
    (model_dir / "config.json").write_text('{"changed": 1}')
    probe = ("import sys; from wvc import Repo; r = Repo.open(sys.argv[1]); r.commit('x'); "
             "print(r.log()[0].author, 'socket' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k != "WVC_AUTHOR"}
    out = subprocess.run([sys.executable, "-c", probe, str(model_dir)], capture_output=True, text=True,
                         timeout=60, env=env)
    assert out.stdout.split() == [f"{getpass.getuser()}@{socket.gethostname()}", "False"], out.stdout + out.stderr
