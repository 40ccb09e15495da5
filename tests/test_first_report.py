"""The first report (``workbook run cpu``'s ``report.html``) shows all it has, judged on the
committed CPU batch (no engine): the committed constraints grids, said to be the committed
ones; the step × row picture says when it is cut; the no-spec run's effective configuration
says "no speculative decoding"; the time chart's parts add up to each run's wall time."""

from __future__ import annotations

import glob
import html
import os
import re

import pytest

from workbook.report import html as H
from workbook.report.runs import load_batch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BATCH = sorted(glob.glob(os.path.join(REPO, "outputs", "cpu", "2026*")))


def _text(page: str) -> str:
    page = re.sub(r"<script.*?</script>|<style.*?</style>|<img[^>]*>", "", page, flags=re.S)
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page)))


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    if not BATCH:
        pytest.skip("no committed CPU batch")
    out = tmp_path_factory.mktemp("first") / "report.html"
    return _text(open(H.write([BATCH[-1]], str(out), committed=True)).read())


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
