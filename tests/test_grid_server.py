"""The constraints grid over ``vllm serve`` (``--set mode=server``, ``workbook.run.constraints.served``).

Table tests without an engine: what a served engine cannot do is refused before any server
starts (rc 2, one line naming it), what the completions API cannot express is "not available
over HTTP", a completion becomes the ``RequestOutput`` shape the one judge reads. One smoke
test with a real ``vllm serve`` of the tiny model (its own server: the row check goes in at
start through the plugin's ``WORKBOOK_ROW_CHECK_DIR``): method ``none``, two constraints,
batches ``mixed-natural`` and ``mixed`` (the worker zeroes its own lm_head for it, as the
control file asks), the healthy reference and the constraint fault ``gate-off`` on ONE server —
the faulted cells violated at the gate, the reference's held (structured output judged through
its grammar, compiled from the server's model folder), judged by ``rowjudge`` from the records
the server's worker wrote into the run folder.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from workbook.core.config import RunConfig
from workbook.run.constraints import served as GS

REPO = Path(__file__).resolve().parents[1]
BASE = RunConfig(mode="server")


@pytest.mark.parametrize("batches,axes,fault,named", [
    (["single", "mixed", "mixed-scaled"], {}, None, None),  # the worker edits its lm_head
    # the worker steers, counts preemptions; the client staggers arrival
    (["mixed-natural"], {"drafter": ["as-is", "greedy"]}, None, None),
    (["mixed-natural"], {"arrival": ["step0", "staggered"]}, None, None),
    (["mixed-natural"], {"preemption": ["off", "on"]}, None, None),
    (["mixed-natural"], {"async_scheduling": ["off", "on"]}, None, "axis 'async_scheduling'"),
    (["mixed-natural"], {}, "stop-string-not-trimmed", "the API front-end's OutputProcessor"),
    (["mixed-natural"], {"logprobs_mode": ["raw_logprobs", "processed_logits"]}, "gate-off",
     None),
    (["mixed-natural"], {}, "stop-not-trimmed", None),
])
def test_refusals(batches, axes, fault, named):
    why = GS.refusals(BASE, batches, axes, fault)
    assert (why is None) if named is None else (named in why)


def test_budget_fault_refused():
    assert "budget fault 'H-d'" in GS.refusals(BASE.replace(fault="H-d"), ["mixed-natural"],
                                               {}, "H-d")


@pytest.mark.parametrize("args,named", [
    (["--set", "mode=server", "--axis", "async_scheduling"],
     "mode=server: axis 'async_scheduling'"),
    (["--set", "mode=server", "--batches", "mixed-natural", "--set",
      "constraint_fault=stop-string-not-trimmed"], "mode=server: constraint fault 'stop-string-not-trimmed'"),
])
def test_refused_before_any_server_in_one_line(tmp_path, args, named):
    res = subprocess.run([sys.executable, "-m", "workbook.cli", "run", "constraints", *args,
                          "--out", str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 2 and named in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and not any(tmp_path.iterdir())


def test_not_over_http_names_the_missing_keywords():
    fields = {"min_tokens", "logit_bias", "stop"}
    assert GS.not_over_http({"min_tokens": 2, "thinking_token_budget": 1}, fields) == \
        ["thinking_token_budget"]
    assert GS.not_over_http({"min_tokens": 2}, fields) == []
    installed = GS.http_fields()
    if installed is not None:  # vLLM's own completions request takes every case's keywords
        from workbook.run.constraints import cases as C

        for name in C.CONSTRAINTS:
            kw = C.case_kwargs(name, [5, 6, 7, 8, 9, 10], lambda ids: "ab")
            assert GS.not_over_http(kw, installed) == [], name


def test_a_completion_as_the_request_output_judge_request_reads():
    resp = {"choices": [{"token_ids": [7, 8], "finish_reason": "length", "text": "ab",
                         "logprobs": {"token_logprobs": [-0.5, -1.0],
                                      "top_logprobs": [{"token_id:7": -0.5, "token_id:3": -2.0},
                                                       {"token_id:9": -0.25}]}}]}
    o = GS.output_of(resp, [1, 2, 3])
    comp = o.outputs[0]
    assert comp.token_ids == [7, 8] and o.prompt_token_ids == [1, 2, 3]
    assert comp.logprobs[0][3].logprob == -2.0 and comp.logprobs[1][8].logprob == -1.0
    assert o.prompt_logprobs is None


def _cells(run_dir: Path) -> dict:
    grid = json.loads((run_dir / "grid.json").read_text())
    return grid, {(c["constraint"], c["method"]): c for c in grid["cells"]}


def test_served_grid_smoke(tmp_path):
    """One ``vllm serve`` of the tiny model: gate-off caught at the gate on both constraints'
    rows in both batches, the healthy reference (same server, fault off) holds, the zeroed
    batch's tokens are the zeroed head's (token 0 wherever the constraint leaves it the
    argmax), files read back from the run folder and judged by the one judge; ``workbook
    report`` renders it."""
    res = subprocess.run([sys.executable, "-m", "workbook.cli", "run", "constraints",
                          "--set", "mode=server", "--methods", "none", "--constraints",
                          "min_tokens", "logit_bias", "structured_output", "--batches",
                          "mixed-natural", "mixed",
                          "--set", "constraint_fault=gate-off", "--out", str(tmp_path)], cwd=REPO,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 1, res.stderr[-3000:]  # the planted fault: violated cells
    run_dir = Path(res.stdout.strip().splitlines()[-1])
    grid = json.loads((run_dir / "grid.json").read_text())
    assert grid["config"]["mode"] == "server"
    cells = {(c["constraint"], c["batch"]): c for c in grid["cells"]}
    for c in ("min_tokens", "logit_bias"):
        for batch in ("mixed-natural", "mixed"):
            cell = cells[(c, batch)]
            assert cell["status"] == "violated", cell
            assert cell["first"]["stage"] == "gate", cell["first"]
            assert cell["rows"] > 0 and cell["verdict"]["verdict"] == "violated"
    ref = {(c["constraint"], c["batch"]): c["status"] for c in grid["reference"]["cells"]}
    assert set(ref.values()) == {"holds"} and len(ref) == 6, ref
    for c in grid["reference"]["cells"]:  # the grammar built from the server's model folder
        if c["constraint"] == "structured_output":
            assert (c.get("grammar") or {}).get("fed", 0) > 0, c
    assert all(cells[("structured_output", b)]["status"] != "not judged"
               for b in ("mixed-natural", "mixed")), cells
    zero = [c for c in grid["reference"]["cells"] if c["batch"] == "mixed"]
    assert any(0 in (c.get("output") or []) for c in zero), zero  # the zeroed head's argmax
    rows = list((run_dir / "logs" / "none" / "rows").glob("*/rows.jsonl"))
    assert rows and rows[0].stat().st_size > 0  # written by the server's worker
    assert (run_dir / "report.html").exists()
