"""The report's finding and wording, table-driven over batch folders written here (no engine).

Each case writes a batch folder as ``workbook run`` leaves it — ``manifest.json`` (the rows
with the configuration the batch ASKED for), and per run ``config.json`` (what the run really
ran), ``verdict.json`` and, for notebook 04, ``fix.json`` — and checks the counts and sentences
of ``workbook.report.finding`` against those files: a run is counted by its own files (the
``fix-guard`` run of the default CPU batch asks for ``guard: false`` and runs the guard), an
interrupted batch says what finished, no ``None`` / ``NaN`` / ``null`` / empty table reaches the
page. Also table-driven: the guard's sentence per ``verdict["guard"]`` (fixed / repaired /
nothing / server / absent) and every repair on the page; each violation kind in a sentence
(no expected token for the forced kinds); the constraints section (only with a grid; "not
judged" never counted as held; the committed grids). ``test_default_cpu_batch_*`` reads a real batch when one is given in
``$WORKBOOK_TEST_BATCH`` (a ``workbook run cpu`` folder).
"""

from __future__ import annotations

import html
import json
import math
import os
import re
from pathlib import Path

import pytest

from workbook.report import finding, runs, wording

HEALTHY = {"verdict": "honored", "hypothesis": None, "hypothesis_title": None,
           "summary": "every budget that could bind was honored at the exact position",
           "first_violation": None, "evidence": [], "markers": {"end": [369]},
           "requests": [{"req_id": "r0", "budget": 1, "expected_end_index": 0, "honored": True,
                         "output": [369, 7]},
                        {"req_id": "r1", "budget": None, "expected_end_index": None,
                         "honored": None, "output": [7, 7]}]}
VIOLATED = {"verdict": "violated", "hypothesis": "H-a",
            "hypothesis_title": "gate bypass: logits processing skipped for this request",
            "summary": "budget lost at the gate", "markers": {"end": [369]},
            "first_violation": {"req_id": "r0", "step": 0, "row": 0, "local_pos": 0,
                                "path": "Sampler", "expected_token": 369, "emitted_token": 7,
                                "output_index": 0},
            "evidence": [{"stage": "gate", "saw": "gate off"}],
            "requests": [{"req_id": "r0", "budget": 1.0, "expected_end_index": 0,
                          "honored": False, "output": [7, 7]}]}
FIX = {"before_after": [{"run": "H-b + guard off", "budget": 1, "honored": False},
                        {"run": "H-b + guard on", "budget": 1, "honored": True}],
       "identity": {"identical": True, "rows": [{"budget": None, "identical": True},
                                                {"budget": 1, "identical": True}]}}


def run(name, verdict, *, asked=None, ran=None, status="ok", fix=None):
    """A run: the config the batch asked for (manifest) and the one it ran (config.json)."""
    asked = {"fault": "none", "guard": False, **(asked or {})}
    return {"name": name, "status": status, "asked": asked,
            "ran": None if ran is None else {**asked, **ran}, "verdict": verdict, "fix": fix}


def write_batch(root: Path, runs_: list[dict], *, planned=None, interrupted=None,
                hardware="cpu", run_id="20261203-200000-000-abcdef") -> str:
    folder = root / hardware / run_id
    folder.mkdir(parents=True)
    rows = []
    for r in runs_:
        d = folder / r["name"]
        d.mkdir()
        if r["ran"] is not None:
            (d / "config.json").write_text(json.dumps(r["ran"]))
        if r["verdict"] is not None:
            (d / "verdict.json").write_text(json.dumps(r["verdict"]))
        if r["fix"] is not None:
            (d / "fix.json").write_text(json.dumps(r["fix"]))
        rows.append({"name": r["name"], "path": r["name"], "status": r["status"],
                     "config": r["asked"], "verdict": r["verdict"], "wall_s": 10.0,
                     "failure": None if r["status"] == "ok" else
                     {"ename": "Interrupted", "evalue": "SIGINT received", "stage": "start"}})
    manifest = {"hardware": hardware, "run_id": run_id, "runs": rows,
                "planned": planned or [r["name"] for r in runs_],
                "status": "interrupted" if interrupted else "ok"}
    if interrupted:
        manifest["interrupted"] = {"signal": "SIGINT", "run": interrupted}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    (folder / "SHA256SUMS").write_text("")
    return str(folder)


REPAIR = {"guard_step": 3, "req_id": "r0", "slot": 0, "row": 0, "total_len_before": 14,
          "field": "budget", "found": [0, 0, 0], "truth": 1, "truth_from": "host"}
GUARD = {"available": True, "installed": True, "enabled": True, "guarded_steps": 9,
         "fixed_tokens": 1, "repaired_fields": 2, "repaired_requests": ["r0"],
         "repairs": [REPAIR, {**REPAIR, "field": "tail[2]", "found": [5, 5, 0], "truth": 5}],
         "repairs_dropped": 0, "truth_lagged_rows": 0}
GUARD_IDLE = {**GUARD, "fixed_tokens": 0, "repaired_fields": 0, "repaired_requests": [],
              "repairs": []}


def forced(kind: str, budget, at: int = 3) -> dict:
    """A violated verdict of one of the forced kinds: no expected token (None, as diagnose
    writes it), the request's ``kind`` / ``at`` / ``forced``."""
    return {**VIOLATED, "first_violation": {
        **VIOLATED["first_violation"], "kind": kind, "budget": budget, "output_index": at,
        "expected_token": None, "emitted_token": 369},
        "requests": [{"req_id": "r0", "budget": budget, "expected_end_index": None,
                      "actual_end_index": at, "honored": False, "kind": kind, "at": at,
                      "forced": [at], "output": [7, 7, 7, 369]}]}


DEFAULT_CPU = [run("reported-mtp", HEALTHY), run("fault-H-a", VIOLATED, asked={"fault": "H-a"},
                                                 ran={}),
               run("fix-guard", {**HEALTHY, "requests": HEALTHY["requests"][:1],
                                 "guard": GUARD},
                   asked={"fault": "H-b"}, ran={"guard": True}, fix=FIX)]

CASES = {
    # name: (runs, batch kwargs, sentences that must be in the headline, ones that must not)
    "default cpu batch: fix-guard counted by its own config and fix.json": (
        DEFAULT_CPU, {},
        ["Healthy vLLM honoured thinking_token_budget in every run on cpu: 1 run without a "
         "fault, 1 of 1 requests judged with </think> exactly where the budget puts it",
         "the budget was violated in 1 of 1 run, caught at its first step and row with its "
         "cause named",
         "The guard fixed the one violation it was tried on (fix-guard: honored — the same "
         "request violated with the guard off in that run)",
         "Guard on vs off on healthy vLLM: 2 of 2 requests token-identical (fix-guard)"],
        ["1 of 2", "None", "NaN"]),
    "guarded twin fixes the fault run": (
        [run("fault-H-a", VIOLATED, asked={"fault": "H-a"}),
         run("fault-H-a-guard", HEALTHY, asked={"fault": "H-a", "guard": True})], {},
        ["violated in 1 of 1 run", "The guard fixed the one violation it was tried on "
         "(fault-H-a-guard: honored)"], ["every run", "None"]),
    "guard does not hold": (
        [run("fault-H-a", VIOLATED, asked={"fault": "H-a"}),
         run("fault-H-a-guard", VIOLATED, asked={"fault": "H-a", "guard": True})], {},
        ["The guard did not fix the one violation it was tried on (fault-H-a-guard: "
         "violated)"], ["fixed the"]),
    "interrupted batch says what finished": (
        [run("a", HEALTHY), run("b", None, status="interrupted")],
        {"planned": ["a", "b", "c"], "interrupted": "b"},
        ["in every run that finished on cpu: 1 run without a fault",
         "was interrupted by SIGINT during b: 1 of 3 planned runs finished; not started: c.",
         "1 run did not finish (1 interrupted)"],
        ["in every run on"]),
    "healthy vLLM violated is an alarm": (
        [run("reported-mtp", VIOLATED), run("no-spec", HEALTHY)], {},
        ["vLLM ignored thinking_token_budget WITHOUT any injected fault in 1 of 2 finished "
         "runs: cpu · reported-mtp (H-a: gate bypass"], ["Healthy vLLM honoured"]),
    "forced kinds and the guard's repairs": (
        [run("fault-early", forced("early", 5), asked={"fault": "H-a"}),
         run("fault-unbudgeted", {**forced("unbudgeted", None), "requests": [
             *forced("unbudgeted", None)["requests"],
             {**forced("early", 5)["requests"][0], "req_id": "r1"}]}, asked={"fault": "H-b"}),
         run("fault-early-guard", {**HEALTHY, "guard": GUARD},
             asked={"fault": "H-a", "guard": True}),
         run("healthy-guard", {**HEALTHY, "guard": GUARD_IDLE}, asked={"guard": True}),
         run("server-guard", {**HEALTHY, "guard": {"installed": True, "available": False,
                                                    "why": "mode='server'"}},
             asked={"guard": True})], {},
        ["violated in 2 of 2 runs", "The guard fixed the one violation it was tried on "
         "(fault-early-guard: honored)", "The guard's own record over the 2 runs that "
         "reported it: 1 token replaced, 2 fields of its own state repaired (1 run ran its "
         "guard in a server worker: not in its files)."], ["None", "NaN"]),
    "unclassified violation says so": (
        [run("fault-x", {**VIOLATED, "hypothesis": None, "hypothesis_title": None},
             asked={"fault": "H-a"})], {},
        ["violated in 1 of 1 run, caught at its first step and row; a cause was named in 0 "
         "of them"], ["None"]),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_finding_counts_what_each_run_did(tmp_path, case):
    runs_, kw, present, absent = CASES[case]
    f = finding.finding([runs.load_batch(write_batch(tmp_path, runs_, **kw))])
    for text in present:
        assert text in f["headline"], f"{text!r} not in\n{f['headline']}"
    for text in absent:
        assert text not in f["headline"], f"{text!r} in\n{f['headline']}"
    lines = finding.terminal_lines(f)
    assert lines[0] == f["headline"]
    violated = [r for r in runs_ if (r["verdict"] or {}).get("verdict") == "violated"]
    guarded = [r for r in runs_ if (r["ran"] or r["asked"]).get("guard") and
               r not in violated and r["verdict"] is not None]
    # one line per violated run, then one per other run with the guard on
    assert len(lines) == 1 + len(violated) + len(guarded)
    for line, r in zip(lines[1:], violated):
        assert f"cpu · {r['name']}" in line and "step 0, row 0" in line
    for line, r in zip(lines[1 + len(violated):], guarded):
        assert line.startswith(f"  guard: cpu · {r['name']}: the guard ")
    assert not any(re.search(r"\bNone\b|\bnan\b|\bNaN\b", x) for x in lines), lines


def test_run_config_is_what_the_run_ran(tmp_path):
    b = runs.load_batch(write_batch(tmp_path, DEFAULT_CPU))
    by = {r.name: r for r in b.runs}
    assert by["fix-guard"].row["config"]["guard"] is False  # what the batch asked for
    assert by["fix-guard"].guard and by["fix-guard"].category == "guard"  # what it ran
    assert by["fix-guard"].guard_off == {"honored": False, "row": FIX["before_after"][0]}
    assert by["reported-mtp"].category == "healthy"  # no config.json: the manifest's
    assert by["fault-H-a"].category == "fault"
    assert [q["budget"] for q in runs.judged_requests(by["fault-H-a"])] == [1]  # not 1.0
    assert isinstance(runs.judged_requests(by["fault-H-a"])[0]["budget"], int)


def _page_text(page: str) -> str:
    """The page's sentences: no scripts, styles, images — nor quoted code and recorded program
    output (``<pre>``: a finding's reproducer and its output, where Python's None is code)."""
    body = re.sub(r"<script.*?</script>|<style.*?</style>|<pre>.*?</pre>", "", page,
                  flags=re.S)
    body = re.sub(r'src="data:[^"]*"', "", body)
    return html.unescape(re.sub(r"<[^>]+>", " ", body))


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_report_page_has_sentences_not_none_nan_null(tmp_path, case):
    from workbook.report import html as rep

    runs_, kw, _, _ = CASES[case]
    text = _page_text(rep.build([runs.load_batch(write_batch(tmp_path, runs_, **kw))]))
    for word in ("None", "NaN", "nan", "null", "undefined"):
        hits = [text[max(0, m.start() - 80):m.end() + 40]
                for m in re.finditer(rf"\b{word}\b", text)]
        assert not hits, hits
    assert ": nothing)" not in text  # an empty table is a sentence, not "(table: nothing)"
    assert "honored — None" not in text


@pytest.mark.parametrize("value,text", [
    (None, "no budget"), (float("nan"), "no budget"), (-1, "no budget"), (1, "1"), (1.0, "1"),
    (23.0, "23"), ("3", "3"), (0, "0"),
])
def test_budget_text(value, text):
    assert wording.budget_text(value) == text


@pytest.mark.parametrize("value,text", [
    (None, "not recorded"), (float("nan"), "not recorded"), ("", "not recorded"),
    ("null", "not recorded"), (True, "yes"), (False, "no"), (2.0, "2"), (0.5, "0.5"),
    ([1, None], "[1, null]"), ("abc", "abc"),
])
def test_value_text(value, text):
    assert wording.value_text(value) == text


@pytest.mark.parametrize("verdict,text", [
    (HEALTHY, "honored — every budget that could bind was honored at the exact position "
              "(2 requests judged)"),
    ({"verdict": "honored"}, "honored — every request ended its reasoning where the budget "
                             "puts it"),
    (VIOLATED, "violated — H-a: gate bypass: logits processing skipped for this request"),
    ({**VIOLATED, "hypothesis": None}, "violated — no cause named (unclassified: see the "
                                       "anomalies)"),
    ({}, "no verdict — the run recorded none (see its failure)"),
    ({"verdict": "inconclusive", "summary": None}, "inconclusive — no summary recorded"),
])
def test_verdict_heading(verdict, text):
    assert wording.verdict_heading(verdict) == text
    assert "None" not in wording.verdict_heading(verdict)


def test_notebook_tables_are_sentences_or_readable():
    import pandas as pd
    from IPython.display import Markdown

    from workbook.core.config import RunConfig
    from workbook.report import views

    empty = views.table([], "No probe ran.", columns=["probe"])
    assert isinstance(empty, Markdown) and empty.data == "No probe ran."
    df = views.table([{"req_id": "a", "budget": 1.0, "x": None},
                      {"req_id": "b", "budget": None, "x": float("nan")}], "unused")
    assert df["budget"].tolist() == ["1", "no budget"] and df["x"].tolist() == ["—", "—"]
    cfg = views.config_table(RunConfig(attention_backend=None, thinking_token_budget=-1))
    assert cfg.loc["attention_backend", "value"] == "not set (vLLM's pick)"
    assert cfg.loc["thinking_token_budget", "value"] == "no budget"
    assert not cfg["value"].astype(str).str.contains(r"\bNone\b|\bnan\b").any()
    eff = views.values_table({"vllm_commit": None, "spec": {"k": 4}}, "effective")
    assert eff.loc["vllm_commit", "effective"] == wording.NOT_RECORDED
    assert isinstance(pd.DataFrame(), pd.DataFrame)


@pytest.mark.skipif(not os.environ.get("WORKBOOK_TEST_BATCH"),
                    reason="set WORKBOOK_TEST_BATCH to a `workbook run cpu` folder")
def test_default_cpu_batch_counts_match_its_files():
    folder = os.environ["WORKBOOK_TEST_BATCH"]
    b = runs.load_batch(folder)
    f = finding.finding([b])
    for r in b.runs:  # every count below is recomputed from the files themselves
        cfg = json.loads(Path(r.folder, "config.json").read_text())
        assert r.guard == bool(cfg.get("guard")) and r.fault == (cfg.get("fault") or "none")
    faults = [r for r in b.runs if r.category == "fault" and r.finished_ok]
    violated = [r for r in faults if runs.verdict_of(r) == "violated"]
    assert f"violated in {len(violated)} of {len(faults)} run" in f["headline"]
    assert not math.isnan(len(f["headline"]))


@pytest.mark.parametrize("meta,stripped", [
    ({"jupytext": {"formats": "ipynb,py:percent"}, "kernelspec": {"name": "workbook"}}, True),
    ({"jupytext": {"formats": "ipynb,py:percent"}, "kernelspec": {"name": "python3"}}, False),
    ({"kernelspec": {"name": "workbook"}}, False),  # not a jupytext pair
])
def test_save_hook_strips_workbook_notebooks_only(meta, stripped):
    from workbook.report import nbclean

    nb = {"metadata": {**meta, "language_info": {"name": "python"}},
          "cells": [{"cell_type": "code", "execution_count": 3, "source": "1",
                     "metadata": {"tags": ["parameters"], "execution": {"t": 1},
                                  "lines_to_next_cell": 2},
                     "outputs": [{"output_type": "stream", "name": "stdout", "text": "1"}]}]}
    nbclean.pre_save_hook({"type": "notebook", "content": nb}, "notebooks/x.ipynb")
    cell = nb["cells"][0]
    assert (cell["outputs"] == [] and cell["execution_count"] is None) is stripped
    if stripped:
        assert cell["metadata"] == {"tags": ["parameters"], "lines_to_next_cell": 2}
        assert set(nb["metadata"]) == {"jupytext", "kernelspec"}
    else:
        assert "language_info" in nb["metadata"]


def test_workbook_run_prints_the_finding(tmp_path, capsys):
    from workbook import cli

    folder = write_batch(tmp_path, DEFAULT_CPU)
    cli._print_finding(folder)
    out = capsys.readouterr().out.splitlines()
    f = finding.finding([runs.load_batch(folder)])
    assert out[0] == f["headline"] and len(out) == 3
    assert out[1].startswith("  violated: cpu · fault-H-a (fault H-a): gate → H-a: gate bypass")
    assert "step 0, row 0 (local_pos 0, Sampler), request 1 of 1 (budget 1)" in out[1]
    assert out[2].startswith("  guard: cpu · fix-guard: the guard fixed 1 token, repaired 2 "
                             "fields of its own state (budget ×1, tail ×1; in request r0; "
                             "first at guard step 3, slot 0: budget found [0, 0, 0], truth 1 "
                             "from host)")


# ---------------------------------------------------------------- the guard, in one sentence

@pytest.mark.parametrize("g,text", [
    (GUARD, "the guard fixed 1 token, repaired 2 fields of its own state (budget ×1, tail ×1; "
            "in request r0; first at guard step 3, slot 0: budget found [0, 0, 0], truth 1 "
            "from host) over 9 guarded steps"),
    (GUARD_IDLE, "the guard changed nothing: 9 guarded steps, no token replaced, no field of "
                 "its own state repaired"),
    ({**GUARD_IDLE, "untaken_rows": 3, "untaken": [
        {"req_id": "r2", "reason": "not taken back: the request has no seed"}]},
     "the guard changed nothing: 9 guarded steps, no token replaced, no field of its own state "
     "repaired; 3 rows kept an end forced where none was due (first: request r2, not taken "
     "back: the request has no seed)"),
    ({**GUARD, "fixed_tokens": 0, "repairs_dropped": 198, "repaired_fields": 200},
     "the guard fixed 0 tokens, repaired 200 fields of its own state (budget ×1, tail ×1; in "
     "request r0; first at guard step 3, slot 0: budget found [0, 0, 0], truth 1 from host; "
     "198 more repair records counted but not kept) over 9 guarded steps"),
    ({**GUARD_IDLE, "truth_lagged_rows": 2, "guarded_steps": 1},
     "the guard changed nothing: 1 guarded step, no token replaced, no field of its own state "
     "repaired; 2 rows took count and tail from the replicas' majority because the host's "
     "truth lagged (async scheduling)"),
    ({"installed": True, "available": False, "why": "mode='server': in the worker"},
     "the guard ran in the server's worker process; its repairs are not in this run's files "
     "(mode='server': in the worker)"),
    ({**GUARD_IDLE, "installed": False, "enabled": None},
     "the guard was asked for but did not run on this engine (not installed or not enabled): "
     "it changed nothing because it never ran"),
    (None, "the guard was on, but this run's verdict holds no guard report (written before "
           "the guard reported its repairs)"),
])
def test_guard_text(g, text):
    assert wording.guard_text(g) == text


def test_report_lists_every_guard_repair(tmp_path):
    from workbook.report import html as rep

    runs_, kw, _, _ = CASES["forced kinds and the guard's repairs"]
    text = " ".join(_page_text(rep.build([runs.load_batch(write_batch(tmp_path, runs_,
                                                                       **kw))])).split())
    assert "What the guard did" in text
    assert "fault-early-guard (guard on): the guard fixed 1 token, repaired 2 fields" in text
    assert "healthy-guard (guard on): the guard changed nothing: 9 guarded steps" in text
    assert "server-guard (guard on): the guard ran in the server's worker process" in text
    assert "every repair the guard logged in fault-early-guard" in text
    assert "tail[2]" in text and "[5, 5, 0]" in text  # each record, not only the first
    assert "2 of 2 requests of this run violated the budget (budgets no budget: unbudgeted, " \
           "5: early)" in text


# ---------------------------------------------------------------- violation kinds

LABEL = {369: "</think> (369)", 7: "'a' (7)"}.get


@pytest.mark.parametrize("fv,text", [
    ({"kind": "missing", "output_index": 1, "expected_token": 369, "emitted_token": 7,
      "budget": 1}, "expected </think> (369) at output index 1, emitted 'a' (7)"),
    ({"output_index": 1, "expected_token": 369, "emitted_token": 7},  # before kinds existed
     "expected </think> (369) at output index 1, emitted 'a' (7)"),
    ({"kind": "missing", "output_index": 4, "expected_token": 369, "emitted_token": None},
     "expected </think> (369) at output index 4, emitted no token (the output ended)"),
    ({"kind": "early", "output_index": 3, "expected_token": None, "emitted_token": 369,
      "budget": 5}, "</think> (369) forced at output index 3 before the budget bound "
                    "(budget 5)"),
    ({"kind": "early", "output_index": 3, "expected_token": None, "emitted_token": 369,
      "budget": 5.0}, "</think> (369) forced at output index 3 before the budget bound "
                      "(budget 5)"),
    ({"kind": "unbudgeted", "output_index": 0, "expected_token": None, "emitted_token": 369,
      "budget": None}, "</think> (369) forced at output index 0 into a request without a "
                       "budget"),
    ({"kind": "twice", "output_index": 9, "expected_token": None, "emitted_token": 369,
      "budget": 2}, "</think> (369) forced twice: again at output index 9, after reasoning "
                    "had already ended (budget 2)"),
    ({"kind": "early", "output_index": None, "expected_token": None, "emitted_token": None,
      "budget": 5}, "the end marker forced at an unrecorded output index before the budget "
                    "bound (budget 5)"),
])
def test_violation_text(fv, text):
    assert wording.violation_text(fv, LABEL) == text


@pytest.mark.parametrize("kind,budget,said", [
    ("early", 5, "request 1 of 1 (budget 5): 369 (369) forced at output index 3 before the budget "
                 "bound (budget 5)"),
    ("unbudgeted", None, "request 1 of 1 (no budget): 369 (369) forced at output index 3 into a "
                         "request without a budget"),
    ("twice", 2, "request 1 of 1 (budget 2): 369 (369) forced twice: again at output index 3"),
])
def test_where_text_says_the_kind(tmp_path, kind, budget, said):
    b = runs.load_batch(write_batch(tmp_path, [run("f", forced(kind, budget),
                                                   asked={"fault": "H-a"})]))
    text = finding.where_text(b.runs[0])
    assert said in text and "None" not in text and "expected" not in text


def test_notebook_first_violation_row_says_the_kind():
    from workbook.report import views

    row, = views.first_violation(forced("unbudgeted", None))
    assert row["kind"] == "unbudgeted" and "expected_token" not in row
    assert row["what"] == "369 forced at output index 3 into a request without a budget"
    df = views.table(views.first_violation(forced("early", 5)), "unused")
    assert not df.astype(str).apply(lambda c: c.str.contains(r"\bNone\b|\bnan\b")).any().any()
    assert views.first_violation(HEALTHY) == []


# ---------------------------------------------------------------- constraints section

def cell(constraint, method, status, **kw):
    base = {"constraint": constraint, "method": method, "batch": "single", "status": status,
            "message": "", "first": None, "breaches": 0, "rows": 16, "draft_rows": 4,
            "accepted_drafts": 2, "output": [1], "finish_reason": "length",
            "differential": None, "kwargs": {}}
    return {**base, **kw}


GRID = {"vllm_version": "0.32.0", "methods": ["none", "mtp"], "batches": ["single"],
        "constraints": ["min_tokens", "logit_bias", "structured_output", "stop"],
        "fault": None, "cells": [
            cell("min_tokens", "none", "holds"), cell("min_tokens", "mtp", "holds"),
            cell("logit_bias", "none", "holds"),
            cell("logit_bias", "mtp", "refused", message="VLLMValidationError: not supported"),
            cell("structured_output", "none", "not judged", message="the output ended by "
                 "length after 16 tokens, before the JSON was complete, so the JSON check "
                 "never ran"),
            cell("stop", "mtp", "violated", breaches=1, first={
                "step": 2, "row": 5, "local_pos": 1, "contract": "stop",
                "stage": "host-side post-processing", "what": "stop token 3 at index 2"},
                differential={"identical": False, "out_index": 2, "step": 2, "row": 5,
                              "margin": None})]}


def test_constraints_summary_counts_not_judged_apart():
    from workbook.report import constraints

    said = constraints.summary(GRID)
    assert "3 held, 1 violated, 1 not judged (structured_output" in said
    assert "1 refused by vLLM" in said
    text = constraints.text_grid(GRID)
    assert "not judged the output ended by length" in " ".join(text.split())
    assert "margin not recorded" in text and "None" not in text and "nan" not in text


def test_constraints_section_only_with_a_grid(tmp_path):
    from workbook.report import constraints
    from workbook.report import html as rep

    assert constraints.section_html([]) == ""
    folder = write_batch(tmp_path, [run("reported-mtp", HEALTHY)])
    out = tmp_path / "r.html"
    assert "Constraints under speculative decoding" not in _page_text(
        Path(rep.write([folder], str(out))).read_text())
    gdir = tmp_path / "cpu" / "constraints-0.32.0"
    gdir.mkdir()
    (gdir / "grid.json").write_text(json.dumps(GRID))
    assert [g["vllm_version"] for g in constraints.load([str(tmp_path / "cpu")])] == ["0.32.0"]
    text = _page_text(Path(rep.write([folder], str(out), grid_paths=[str(gdir)])).read_text())
    assert "Constraints under speculative decoding" in text
    assert "not judged the output ended by length" in " ".join(text.split())
    for word in ("None", "NaN", "nan", "null"):
        assert not re.search(rf"\b{word}\b", text), word


@pytest.mark.parametrize("schema,finish,text,why", [
    ({"type": "object"}, "length", None, "no grammar evidence, and the output ended by length "
                                         "after 3 tokens, before the JSON was complete, so the "
                                         "JSON check never ran"),
    ({"type": "object"}, "stop", "{}", None),
    ({"type": "object"}, "stop", None, "no grammar evidence, and the output's text was not "
                                       "returned, so the JSON check never ran"),
    (None, "length", None, None),
])
def test_output_contract_not_judged(schema, finish, text, why):
    from workbook.core import contracts

    p = contracts.Params(json_schema=schema)
    got = contracts.unjudged(p, [1, 2, 3], finish, text)
    assert got.get("structured_output") == why
    if why is None:
        assert not contracts.check_output(p, [], [1, 2, 3], finish, text=text)


@pytest.mark.parametrize("version", ["0.32.0", "0.31.0", "0.30.0", "0.29.0", "0.28.0"])
def test_committed_grids_never_count_an_unjudged_cell_as_held(version):
    from workbook.core import rundir

    g = rundir.read_json(str(Path(__file__).parent.parent.joinpath(
        "outputs", "cpu", f"constraints-{version}", "grid.json")))
    for c in g["cells"]:
        # without grammar evidence (grids before it) an unfinished structured output is unjudged
        if c["constraint"] == "structured_output" and c["finish_reason"] != "stop" and \
                not (c.get("grammar") or {}).get("fed"):
            assert c["status"] in ("not judged", "refused", "method refused", "error"), c["status"]


def test_a_method_vllm_refuses_at_start_is_said_apart_with_its_message():
    """vLLM 0.28–0.31 refuse ngram under MRV2 when the engine is configured (pydantic puts the
    reason on the message's second line): the grid keeps vLLM's reason and counts those cells
    apart from held / refused parameters."""
    import pydantic

    from workbook.report import constraints
    from workbook.run.constraints.cases import _is_refusal, _msg

    class Speculative(pydantic.BaseModel):
        method: str

        @pydantic.field_validator("method")
        @classmethod
        def _mrv2(cls, v):
            raise ValueError(f"Model Runner V2 does not yet support {v}")

    with pytest.raises(pydantic.ValidationError) as e:
        Speculative(method="ngram")
    assert _is_refusal(e.value)
    msg = _msg(e.value)
    assert msg.startswith("ValidationError: 1 validation error for Speculative")
    assert msg.endswith("Value error, Model Runner V2 does not yet support ngram")  # no echo
    assert _is_refusal(type("VLLMValidationError", (Exception,), {})("min_p"))  # not a ValueError
    grid = {**GRID, "methods": ["none", "mtp", "ngram"], "cells": GRID["cells"] + [
        cell(c, "ngram", "method refused", message=msg) for c in GRID["constraints"]]}
    said = constraints.summary(grid)
    assert "1 refused by vLLM, 4 not run because vLLM refused the method itself at engine " \
           "start (ngram)" in said
    assert "Model Runner V2 does not yet support ngram" in constraints.table_html(grid)


def test_the_report_leads_with_what_the_constraints_grids_found():
    """Per constraint, what held and what did not: a violated group named by its configuration,
    methods, versions and the finding covering it (or that none does) — counted from the
    cells; a violation method none shows too is "with and without speculative decoding", one
    none held at the same point "only under speculative decoding"; a clean grid says so."""
    from workbook.report import answer

    clean = {**GRID, "cells": [c for c in GRID["cells"] if c["status"] != "violated"]}
    bad = {**clean, "vllm_version": "0.31.0", "cells": clean["cells"] + [
        cell("stop", "none", "holds"),
        cell("stop_strings", "mtp", "violated", first={
            "step": 1, "row": 2, "stage": "host-side post-processing",
            "what": "stop string '!!!' completes at output index 2, then 2 more token(s) "
                    "returned"}),
        cell("stop_strings", "none", "holds"),
        cell("thinking_token_budget", "none", "violated", axes={"reasoning": "after-end"},
             verdict={"contract": "thinking_token_budget", "verdict": "violated"}),
        cell("thinking_token_budget", "mtp", "violated", axes={"reasoning": "after-end"},
             verdict={"contract": "thinking_token_budget", "verdict": "violated"}),
        cell("thinking_token_budget", "mtp", "holds", axes={"reasoning": "default"}),
        cell("logprobs", "none", "violated", axes={"reasoning": "strings"}),
        cell("logprobs", "mtp", "holds", axes={"reasoning": "strings"})],
        "axis_defaults": {"reasoning": "default"}}
    finding = {"id": "end-str-cut", "constraint": "thinking_token_budget",
               "axes": {"reasoning": "after-end"}, "triage": "known",
               "evidence": [{"kind": "pull request", "state": "open", "says": "…",
                             "url": "https://github.com/vllm-project/vllm/pull/54467"}]}
    groups = answer.violated_groups([bad, clean], [finding])
    by = {(g.constraint, g.finding["id"] if g.finding else None): g for g in groups}
    assert set(by) == {("stop_strings", None), ("thinking_token_budget", "end-str-cut"),
                       ("logprobs", None)}
    assert answer.speculation(by["logprobs", None]) == (
        "only without speculative decoding", "the speculative methods at the same points: "
        "1 holds")  # never "with and without" for method none alone
    budget = by["thinking_token_budget", "end-str-cut"]
    assert answer.configuration_text(budget) == "reasoning=after-end"
    assert answer.speculation(budget)[0] == "with and without speculative decoding"
    stop = by["stop_strings", None]
    assert answer.speculation(stop) == ("only under speculative decoding",
                                        "method none held at the same points")
    box = answer.constraints_html([bad, clean], groups)
    assert "finding <a href=\"#findings\"><b>end-str-cut</b></a> — known upstream: " \
           '<a href="https://github.com/vllm-project/vllm/pull/54467">vLLM PR #54467</a>' in box
    assert "no finding in outputs/findings/findings.yaml covers it: not triaged" in box
    assert "3 of 7 constraints violated in some configuration" in box
    assert 'class="finding alarm cbox"' in box and "None" not in box
    lines = answer.grid_lines([bad, clean], groups)
    assert "thinking_token_budget held in 1 of 3 cells, and none of the default " \
           "configuration violated; violated in 2 cells, in 1 configuration: " \
           "reasoning=after-end with and without speculative decoding (finding end-str-cut)" \
           in lines[0]
    # a finding whose reproducer held on a version does not cover that version's cells
    stop_f = {"id": "stop-past", "constraint": "stop_strings", "triage": "known",
              "versions": {"0.31.0": "violated", "0.32.0": "held"}}
    later = {**bad, "vllm_version": "0.32.0"}
    got = {(g.constraint, g.finding["id"] if g.finding else None, len(g.cells))
           for g in answer.violated_groups([bad, later], [stop_f]) if g.constraint ==
           "stop_strings"}
    assert got == {("stop_strings", "stop-past", 1), ("stop_strings", None, 1)}
    ok = answer.constraints_html([clean], answer.violated_groups([clean], []))
    assert "Every judged constraint held" in ok and "alarm" not in ok
    assert answer.constraints_html([], []) == ""


def test_first_screen_of_the_committed_grids_never_contradicts_itself():
    """On the committed grids: the budget's violations are all reasoning_end_str
    configurations, none of them said to be "under speculative decoding" when method none
    shows the same; every violated cell is in exactly one group."""
    from workbook.report import answer, findings
    from workbook.report import html as H

    grids = H.constraints_section.load(H.committed_grids()[0])
    groups = answer.violated_groups(grids, findings.load())
    n_bad = sum(c["status"] == "violated" for g in grids for c in g["cells"])
    assert sum(len(x.cells) for x in groups) == n_bad > 0
    for x in groups:
        head, _ = answer.speculation(x)
        if "none" in x.methods:
            assert (head == "with and without speculative decoding" if len(x.methods) > 1
                    else head.endswith("without speculative decoding")), (x.constraint, head)
        assert "speculative decoding" in head
        if x.constraint == "thinking_token_budget":
            assert all(answer.non_default(g, c).get("reasoning") not in (None, "default")
                       for g, c in x.cells)
    assert answer.grids_label(grids).startswith("committed evidence (")
    # every violated group of the committed grids is a registered, triaged finding
    assert [(x.constraint, answer.configuration_text(x)) for x in groups
            if x.finding is None] == []
