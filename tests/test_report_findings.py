"""The findings registry (outputs/findings/findings.yaml) and its report section: every finding
finished (no field empty, its reproducer and evidence present, a triage record), its ✗ cells
linked, an intended behaviour never shown as a violation; `workbook findings` and its upstream
report. No engine."""

import os
import re

import pytest

from workbook.report import axes, findings


def test_committed_registry_is_complete():
    found = findings.load()
    assert found, "no finding in outputs/findings/findings.yaml"
    for f in found:
        assert bool(findings.violated_in(f)) == (f["triage"] != "intended"), f["id"]
        assert f["triage"] in findings.TRIAGES and f["query_log"], f["id"]
        assert "PENDING" not in repr(f), f["id"]
        assert isinstance(f["first"]["step"], int) and isinstance(f["first"]["row"], int), f["id"]
        repro = open(os.path.join(f["root"], f["reproducer"]), encoding="utf-8").read()
        assert "workbook" not in re.sub(r'""".*?"""', "", repro, flags=re.S), \
            f"{f['id']}: the reproducer imports the workbook"


def _finding(tmp_path, **kw) -> dict:
    """A complete registry entry (known, one PR) with its files under ``tmp_path``."""
    for name in ("r.py", "out.txt"):
        (tmp_path / name).write_text("print(1)\n")
    f = {"id": "x", "title": "t", "constraint": "stop", "methods": ["mtp"], "promise": "p",
         "promise_source": "https://example.org/doc", "reproducer": "r.py",
         "command": "python r.py", "outputs": ["out.txt"],
         "first": {"step": 1, "row": 2, "output_index": 3, "what": "w"},
         "versions": {"0.32.0": "violated"}, "triage": "known", "triage_note": "n",
         "evidence": [{"kind": "pull request", "url": "https://github.com/o/r/pull/1",
                       "state": "open", "says": "s"}],
         "query_log": [{"date": "2026-12-06", "corpus": "issues", "query": "q", "found": "f"}]}
    f.update(kw)
    return f


@pytest.mark.parametrize("drop", ["triage", "query_log", "evidence", "first", "versions",
                                  "reproducer", "promise_source"])
def test_an_unfinished_finding_is_refused_naming_the_field(tmp_path, drop):
    import yaml

    (tmp_path / "r.py").write_text("print(1)\n")
    f = _finding(tmp_path)
    f.pop(drop)
    p = tmp_path / "findings.yaml"
    p.write_text(yaml.safe_dump([f]))
    with pytest.raises(findings.BadRegistry,
                       match="no triage record" if drop == "triage" else drop):
        findings.load(str(p))


def test_a_missing_reproducer_or_bad_state_is_refused(tmp_path):
    import yaml

    f = _finding(tmp_path, reproducer="gone.py")
    (tmp_path / "gone.py").unlink(missing_ok=True)
    p = tmp_path / "findings.yaml"
    p.write_text(yaml.safe_dump([f]))
    with pytest.raises(findings.BadRegistry, match="gone.py"):
        findings.load(str(p))
    (tmp_path / "gone.py").write_text("")
    f["versions"] = {"0.32.0": "broken"}
    p.write_text(yaml.safe_dump([f]))
    with pytest.raises(findings.BadRegistry, match="broken"):
        findings.load(str(p))


def test_violated_cell_links_its_reproducer_and_upstream(tmp_path):
    found = findings.load()
    f = found[0]
    v = findings.violated_in(f)[0]
    ax = dict(f.get("axes") or {})
    cell = {"constraint": f["constraint"], "method": f["methods"][0], "batch": "mixed",
            "status": "violated", "axes": ax, "first": {"step": 1, "row": 0, "stage": "s",
                                                       "what": "w"}}
    grid = {"vllm_version": v, "axes": {k: [x] for k, x in ax.items()},
            "cells": [cell], "methods": [cell["method"]], "constraints": [cell["constraint"]]}
    findings.attach([grid], found, str(tmp_path))
    page = axes.axes_html(grid)
    assert os.path.basename(f["reproducer"]) in page
    assert "PR #" in page or "nothing found upstream" in page
    other = dict(grid, vllm_version="0.0.1")
    findings.attach([other], found, str(tmp_path))
    assert other["findings"] == []


def test_section_reads_as_sentences():
    found = findings.load()
    page = findings.section_html(found, None)
    for f in found:
        assert f["title"] in page.replace("&#x27;", "'").replace("&quot;", '"')
    prose = re.sub(r"<pre>.*?</pre>", "", page, flags=re.S)  # the embedded report's code
    for bad in ("None", "nan", "{'", "PENDING"):
        assert bad not in prose
    assert page.count("<pre>") == len(findings.defects(found))  # each defect's ready report
    assert findings.section_html([], None) == ""


@pytest.mark.parametrize("bad, match", [
    ({"triage": "maybe"}, "triage 'maybe'"),
    ({"evidence": [{"kind": "pull request", "url": "u", "says": "s"}]}, "lacks state"),
    ({"evidence": [{"kind": "vLLM test", "file": "t.py", "says": "s"}]}, "lacks version"),
    ({"triage": "intended", "evidence": [{"kind": "issue", "url": "u", "state": "open",
                                          "says": "s"}]}, "without a vLLM test"),
    ({"triage": "intended", "evidence": [{"kind": "vLLM test", "file": "t.py",
                                          "version": "0.34.0", "says": "s"}]},
     "triaged intended but marked violated"),
    ({"triage": "known", "versions": {"0.32.0": "observed"}}, "violated on no version"),
    ({"query_log": [{"date": "2026-12-06", "corpus": "issues", "query": "q"}]}, "lacks found"),
])
def test_a_bad_triage_record_is_refused(tmp_path, bad, match):
    import yaml

    p = tmp_path / "findings.yaml"
    p.write_text(yaml.safe_dump([_finding(tmp_path, **bad)]))
    with pytest.raises(findings.BadRegistry, match=match):
        findings.load(str(p))


def test_intended_is_not_a_violation_anywhere():
    """The behaviour vLLM's tests pin (a begun end string continued) is triaged intended: never
    attached to a ✗ cell, listed apart in the report, and its report refused."""
    found = findings.load()
    meant = findings.intended(found)
    assert [f["id"] for f in meant] == ["end-str-started-by-prompt-token"]
    f = meant[0]
    assert any(e.get("function") == "test_v2_thinking_budget_continues_end_prefix_from_prompt"
               for e in f["evidence"])
    grid = {"vllm_version": "0.32.0", "cells": []}
    findings.attach([grid], found)
    assert f["id"] not in {x["id"] for x in grid["findings"]}
    page = findings.section_html(found)
    table, _, rest = page.partition("Triaged as intended")
    assert f["id"] not in table and f["id"] in rest
    known = {g["id"]: findings.triage_line(g) for g in findings.defects(found)}
    assert "#54467" in known["end-str-cut-at-natural-end"]
    assert "#52677" in known["end-str-without-natural-end-forced-again"]
    assert "#43210" in known["end-str-without-natural-end-forced-again"]


def test_findings_command_lists_and_reports(tmp_path, capsys):
    from workbook import cli

    assert cli.main(["findings"]) == 0
    out = capsys.readouterr().out
    for f in findings.load():
        assert f["id"] in out and f["triage"] in out
    assert cli.main(["findings", "report", "no-such-finding"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no-such-finding" in err[0] and "Traceback" not in err[0]
    assert cli.main(["findings", "report", "end-str-started-by-prompt-token"]) == 2
    assert "intended" in capsys.readouterr().err
    dest = tmp_path / "issue.md"
    assert cli.main(["findings", "report", "end-str-cut-at-natural-end", "-o", str(dest)]) == 0
    md = dest.read_text()
    for part in ("# [Bug]:", "## What vLLM promises", "docs/features/reasoning_outputs.md",
                 "## Reproducer (plain vLLM", "from vllm import LLM", "### Its output",
                 "VIOLATED: output index 1", "## First violating step and row",
                 "## Environment (`vllm collect-env`)", "vLLM Version", "## Upstream search",
                 "https://github.com/vllm-project/vllm/pull/54467", "Known upstream"):
        assert part in md, part
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    assert repo not in md and os.path.expanduser("~") + "/" not in md
    assert "](outputs/" not in md and "](../" not in md  # nothing relative to the clone
