"""The HTML report: leads with the finding, fits a 1400 px window, and is self-contained.

Built with ``workbook report`` from the committed evidence (``outputs/``: the latest finished
CPU batch and the H200 batch with injected faults, guarded twins and 20 runs — the case where
a reader most needs the finding first), then opened in headless Chromium (``tests/_browser``)
with networking blocked: it requests nothing but ``file:`` and ``data:`` URLs, logs no console
error, builds its interactive tables without paging, shows the finding on the first screen,
shows no "NaN" / "None", and nothing is cut off at the right of a 1400 px window (no table,
grid, plot or page wider than its box). Screenshots of the first screen and of the whole page
are kept (``$WORKBOOK_TEST_ARTEFACTS`` or the test's tmp folder; paths printed). The executed
notebooks the report links (rendered by nbconvert) open offline as well.

About 1 minute on a 2-core machine; no engine starts (the batch path is covered by
``tests/test_batch.py``, whose runs write ``report.html`` with the same code).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from _browser import Browser, chromium_binary  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
ALLOWED_SCHEMES = ("file:", "data:")
WIDTH = 1400


def workbook(*args, timeout=900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "workbook.cli", *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


def artefacts(tmp: Path) -> Path:
    d = Path(os.environ.get("WORKBOOK_TEST_ARTEFACTS") or tmp)
    d.mkdir(parents=True, exist_ok=True)
    return d


@pytest.fixture(scope="module")
def evidence() -> list[Path]:
    # the committed CPU batch and the H200 batch with the tiny matrix's faults (the newer H200
    # folders hold the reporter-shaped runs)
    found = [REPO / "outputs" / "cpu" / "20261202-152047-391-deb925",
             REPO / "outputs" / "h200" / "20261202-151415-618-bb9092"]
    assert all(d.is_dir() for d in found), found
    return found


@pytest.fixture(scope="module")
def report(tmp_path_factory, evidence) -> Path:
    out = tmp_path_factory.mktemp("report") / "report.html"
    res = workbook("report", *evidence, "-o", out)
    assert res.returncode == 0, res.stderr[-3000:]
    assert Path(res.stdout.strip()) == out and out.is_file()
    return out


@pytest.fixture(scope="module")
def page(report, tmp_path_factory):
    """The report opened in Chromium: the DOM facts the tests check, and the event log."""
    shots = artefacts(tmp_path_factory.mktemp("shots"))
    browser = Browser(chromium_binary(), width=WIDTH, height=1000)
    try:
        browser.call("Page.navigate", url=report.resolve().as_uri())
        browser.wait_event("Page.loadEventFired", timeout=120)
        n_tables = report.read_text().count('<table id="wbtable')
        browser.wait_for(f"document.querySelectorAll('table.dataTable').length == {n_tables}",
                         timeout=60)
        browser.settle(2.0)
        first = browser.screenshot(str(shots / "report-first-screen.png"))
        full = browser.screenshot(str(shots / "report-full-page.png"), full_page=True)
        print(f"\nscreenshots: {first} {full}")
        dom = json.loads(browser.evaluate(r"""JSON.stringify((() => {
            const vw = document.documentElement.clientWidth;
            const cut = [];
            for (const el of document.querySelectorAll('.tw, .wbg-wrap, img, pre, section, h1, h2, h3, p')) {
                const r = el.getBoundingClientRect();
                if (r.right > vw + 1) cut.push([el.tagName, el.className, Math.round(r.right)]);
                if ((el.classList.contains('tw') || el.classList.contains('wbg-wrap'))
                    && el.scrollWidth > el.clientWidth + 1)
                    cut.push([el.tagName, el.className, el.scrollWidth, el.clientWidth]);
            }
            const head = document.querySelector('p.headline');
            return {
              n_tables: document.querySelectorAll('table.dataTable').length,
              paging: document.querySelectorAll('.dt-paging, .dataTables_paginate, .dt-length').length,
              table_rows: [...document.querySelectorAll('table.dataTable')].map(t => t.tBodies[0].rows.length),
              headings: [...document.querySelectorAll('h2')].map(h => h.textContent),
              headline: head ? head.textContent : null,
              headline_top: head ? head.getBoundingClientRect().top : null,
              finding: (document.querySelector('section.finding') || {}).innerText || '',
              tables_text: [...document.querySelectorAll('table')].map(t => t.innerText).join('\n'),
              text: document.body.innerText,
              page_width: document.documentElement.scrollWidth, viewport: vw, cut: cut,
              images: [...document.images].map(i => [i.src.slice(0, 22), i.naturalWidth]),
              links: [...document.querySelectorAll('a[href$=".html"]')].map(a => a.getAttribute('href'))};
        })())"""))
    finally:
        browser.close()
    return {"dom": dom, "browser": browser, "n_tables": n_tables}


def test_report_is_one_file_with_embedded_assets(report):
    text = report.read_text()
    assert "<script src=" not in text and "<link " not in text
    assert 'src="http' not in text and "require.js" not in text and "MathJax" not in text
    assert text.count('<img alt="') >= 2 and 'src="data:image/png;base64,' in text


def test_report_opens_offline_without_requests_or_errors(page):
    browser = page["browser"]
    urls = [r["request"]["url"] for r in browser.of("Network.requestWillBeSent")]
    assert urls and urls[0].startswith("file:")
    assert [u for u in urls if not u.startswith(ALLOWED_SCHEMES)] == []
    assert browser.of("Network.loadingFailed") == []
    assert browser.of("Runtime.exceptionThrown") == []
    console_errors = [c for c in browser.of("Runtime.consoleAPICalled")
                      if c["type"] in ("error", "assert")]
    assert console_errors == []
    assert [e for e in browser.of("Log.entryAdded") if e["entry"]["level"] == "error"] == []
    dom = page["dom"]
    assert dom["images"] and all(src.startswith("data:image/png") and w > 0
                                 for src, w in dom["images"])


def test_report_leads_with_the_finding_on_the_first_screen(page, evidence):
    dom = page["dom"]
    assert dom["headline"] and dom["headline_top"] < 300
    assert "honoured" in dom["headline"] or "WITHOUT any injected fault" in dom["headline"]
    finding = dom["finding"]
    for d in evidence:  # one paragraph per hardware and batch
        assert d.name in finding and d.parent.name in finding
    # each violated run: stage → cause → first step / row, and whether the guard fixed it
    assert re.search(r"fault-H-d-draft.*(kernel|device state) → H-d(-kernel)?: .*→ step 41, row 1", finding)
    assert "fixed by the guard (fault-H-d-draft-guard: honored)" in finding
    assert dom["headings"][:2] == ["Verdicts", "Violations: the step × row picture"]


def test_report_tables_fit_and_show_no_empty_markers(page, evidence):
    dom = page["dom"]
    assert dom["n_tables"] == page["n_tables"] >= 1
    assert dom["paging"] == 0  # every row on the page
    from workbook.report import html as rep

    n_runs = sum(len(rep.load_batch(str(d)).runs) for d in evidence)
    assert dom["table_rows"][0] == n_runs
    assert dom["page_width"] <= dom["viewport"], dom["page_width"]
    assert dom["cut"] == []
    assert not re.search(r"\b(NaN|None|nan)\b", dom["tables_text"])
    assert "—" in dom["tables_text"]


def test_violations_are_pictured_and_compared_per_request(evidence):
    from workbook.report import html as rep

    runs = [r for d in evidence for r in rep.load_batch(str(d)).runs]
    bad = next(r for r in runs if r.name == "fault-H-d-draft")
    reqs = rep.judged_requests(bad)
    assert len(reqs) == len(bad.verdict["requests"]) == 9  # every request judged
    assert [q["honored"] for q in reqs].count(False) == 6
    twin = rep.nearest_honoured(bad, runs)
    assert twin.name == "fault-H-d-draft-guard"
    first, table, index = rep.divergence(bad, twin)
    assert index == 2 and first == 2  # request 3 (budget 3) diverges where </think> was due
    assert "</think>" in " ".join(table["emitted B"])
    page = rep.build([rep.load_batch(str(d)) for d in evidence])
    assert page.count('class="wbg"') == sum(rep.verdict_name(r) == "violated" for r in runs)
    assert "wbg-due-bad" in page and "&lt;/think&gt; logit before bias" in page


def test_linked_notebooks_open_offline(report, page):
    links = page["dom"]["links"]
    assert links, "the report links the executed notebooks"
    target = (report.parent / links[0]).resolve()
    assert target.is_file()
    browser = Browser(chromium_binary(), width=WIDTH, height=900)
    try:
        browser.call("Page.navigate", url=target.as_uri())
        browser.wait_event("Page.loadEventFired", timeout=120)
        browser.settle(2.0)
        text = browser.evaluate("document.body.innerText")
    finally:
        browser.close()
    urls = [r["request"]["url"] for r in browser.of("Network.requestWillBeSent")]
    assert [u for u in urls if not u.startswith(ALLOWED_SCHEMES)] == []
    assert browser.of("Runtime.exceptionThrown") == []
    assert "Reproduce" in text or "Verdict" in text


def test_report_without_runs_is_an_error(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    for args in ([empty], ["--out", empty], [tmp_path / "missing"]):
        res = workbook("report", *args, "-o", tmp_path / "r.html")
        assert res.returncode == 2, res
        assert "workbook report:" in res.stderr and "Traceback" not in res.stderr
    batch = tmp_path / "out" / "hw" / "20260101-000000-000-aaaaaa"  # a batch with no runs
    batch.mkdir(parents=True)
    (batch / "manifest.json").write_text(json.dumps({"hardware": "hw", "status": "aborted",
                                                     "runs": [], "planned": ["x"]}))
    (batch / "SHA256SUMS").write_text("")
    res = workbook("report", batch, "-o", tmp_path / "r.html")
    assert res.returncode == 2 and "no runs" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "r.html").exists()
