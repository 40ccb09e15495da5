"""The findings registry (outputs/findings/findings.yaml) and its report section: every finding
finished (no field empty, its reproducer and evidence present), its ✗ cells linked. No engine."""

import os
import re

import pytest

from workbook.report import axes, findings


def test_committed_registry_is_complete():
    found = findings.load()
    assert found, "no finding in outputs/findings/findings.yaml"
    for f in found:
        assert findings.violated_in(f), f["id"]
        assert "PENDING" not in repr(f), f["id"]
        assert isinstance(f["first"]["step"], int) and isinstance(f["first"]["row"], int), f["id"]
        repro = open(os.path.join(f["root"], f["reproducer"]), encoding="utf-8").read()
        assert "workbook" not in re.sub(r'""".*?"""', "", repro, flags=re.S), \
            f"{f['id']}: the reproducer imports the workbook"


@pytest.mark.parametrize("drop", ["upstream", "first", "versions", "reproducer"])
def test_an_unfinished_finding_is_refused_naming_the_field(tmp_path, drop):
    import yaml

    (tmp_path / "r.py").write_text("print(1)\n")
    f = {"id": "x", "title": "t", "constraint": "stop", "methods": ["mtp"], "promise": "p",
         "reproducer": "r.py", "command": "python r.py",
         "first": {"step": 1, "row": 2, "output_index": 3, "what": "w"},
         "versions": {"0.32.0": "violated"}, "upstream": "none found"}
    f.pop(drop)
    p = tmp_path / "findings.yaml"
    p.write_text(yaml.safe_dump([f]))
    with pytest.raises(findings.BadRegistry, match=drop):
        findings.load(str(p))


def test_a_missing_reproducer_or_bad_state_is_refused(tmp_path):
    import yaml

    f = {"id": "x", "title": "t", "constraint": "stop", "methods": ["mtp"], "promise": "p",
         "reproducer": "gone.py", "command": "c",
         "first": {"step": 1, "row": 2, "output_index": 3, "what": "w"},
         "versions": {"0.32.0": "violated"}, "upstream": "u"}
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
    assert "PR #" in page or "none found" in page
    other = dict(grid, vllm_version="0.0.1")
    findings.attach([other], found, str(tmp_path))
    assert other["findings"] == []


def test_section_reads_as_sentences():
    found = findings.load()
    page = findings.section_html(found, None)
    for f in found:
        assert f["title"] in page.replace("&#x27;", "'")
    for bad in ("None", "nan", "{'", "PENDING"):
        assert bad not in page
    assert findings.section_html([], None) == ""
