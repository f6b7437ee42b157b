"""Paths on the command line are taken from the current directory, as git takes pathspecs
(issue 37, finding 2: `checkout HEAD -- config.json` in a subdirectory restored the root's
file and discarded its uncommitted edit)."""

from .test_everyday import run


def _model(tmp_path):
    root = tmp_path / "model"
    (root / "1_Pooling").mkdir(parents=True)
    (root / "config.json").write_text('{"root": 1}')
    (root / "1_Pooling" / "config.json").write_text('{"pool": 1}')
    run(root, "init")
    run(root, "commit", "-m", "one")
    (root / "config.json").write_text('{"root": "edited"}')
    (root / "1_Pooling" / "config.json").write_text('{"pool": "edited"}')
    return root


def test_checkout_paths_are_relative_to_the_current_directory(tmp_path):
    root = _model(tmp_path)
    r = run(root / "1_Pooling", "checkout", "HEAD", "--", "config.json")
    assert "1_Pooling/config.json" in r.stdout
    assert (root / "1_Pooling" / "config.json").read_text() == '{"pool": 1}'
    assert (root / "config.json").read_text() == '{"root": "edited"}'  # the root's edit is kept


def test_a_path_leaving_the_repository_is_refused_and_dot_dot_reaches_the_root(tmp_path):
    root = _model(tmp_path)
    r = run(root / "1_Pooling", "checkout", "HEAD", "--", "../../elsewhere", check=False)
    assert r.returncode != 0 and "outside the repository" in r.stderr
    assert (root / "config.json").read_text() == '{"root": "edited"}'
    run(root / "1_Pooling", "checkout", "HEAD", "--", "..")
    assert (root / "config.json").read_text() == '{"root": 1}'
    assert (root / "1_Pooling" / "config.json").read_text() == '{"pool": 1}'


def test_cat_dot_slash_is_from_the_current_directory(tmp_path):
    root = _model(tmp_path)
    assert run(root / "1_Pooling", "cat", "HEAD:./config.json").stdout == '{"pool": 1}'
    assert run(root / "1_Pooling", "cat", "HEAD:config.json").stdout == '{"root": 1}'  # REV:PATH is from the root
