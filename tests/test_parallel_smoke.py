"""Tensor parallel 2 on the CPU platform, end to end: one engine start (two worker processes,
one core each), the reported request with MTP k=4 and budget 1 through the pipeline, the hooks
in both workers through the plugin (docs/parallel.md). Marked ``parallel`` (deselect with
``-m "not parallel"``): 34 s on the idle 2-core machine, in a child process (see the test).""" 

import json
import os

import pytest



CHILD = """
import json, sys
from workbook.core.config import RunConfig
from workbook.run import backends, pipeline
cfg = RunConfig(tensor_parallel_size=2, spec_method="mtp", num_spec_tokens=4,
                thinking_token_budget=1, max_tokens=12, temperature=0.0, trace=True, guard=True)
try:
    res = pipeline.run(cfg, sys.argv[1])
finally:
    for eng, _ in backends._RANKED.values():
        eng.shutdown()
print("VERDICT " + json.dumps(res.verdict, default=str))
"""


@pytest.mark.parallel
def test_parallel_smoke_tp2_mtp_budget_honored_and_both_ranks_agree(tmp_path):
    """In a child process: vLLM's parallel groups are process-global, so a TP2 engine's
    shutdown in the test process would tear down the groups of the single-rank engines the
    other tests share (get_pp_group(): "pipeline model parallel group is not initialized")."""
    import subprocess
    import sys

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("tensor parallel 2 on a CPU binds one core per rank: needs 2 cores")
    out = tmp_path / "tp2"
    p = subprocess.run([sys.executable, "-c", CHILD, str(out)], capture_output=True, text=True,
                       timeout=900, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    line = next((x for x in p.stdout.splitlines() if x.startswith("VERDICT ")), None)
    assert p.returncode == 0 and line, (p.returncode, p.stdout[-2000:], p.stderr[-4000:])
    v = json.loads(line[len("VERDICT "):])
    assert v["verdict"] == "honored"
    assert v["ranks"]["ranks"] == ["pp0/tp0", "pp0/tp1"]
    assert v["ranks"]["agree"] and v["ranks"]["compared_rows"] > 0
    g = v["guard"]  # each rank's guard wrote its report; healthy vLLM: nothing to fix
    assert g["available"] and set(g["ranks"]) == {"pp0/tp0", "pp0/tp1"}
    assert g["agreement"]["agree"] and g["fixed_tokens"] == 0 and g["guarded_steps"] > 0
    assert json.loads((out / "ranks.json").read_text())["agree"]
    assert sorted(json.loads(p.read_text())["tp_rank"]
                  for p in (out / "trace-ranks").glob("*/rank.json")) == [0, 1]


ONE_RANK = CHILD.replace("import json, sys", "import json, os, sys\nos.environ['WORKBOOK_FAULT_RANKS'] = '1'") \
    .replace("trace=True, guard=True)", "trace=True, guard=False, fault='H-a')")


@pytest.mark.parallel
def test_a_fault_in_one_rank_only_is_a_disagreement_named_at_its_step(tmp_path):
    """Fault H-a (the gate bypass) planted in tensor-parallel rank 1 only
    (``WORKBOOK_FAULT_RANKS=1``): vLLM returns rank 0's tokens, which honor the budget, while
    rank 1 skipped the budget — its gate, fast path and sampled token differ from rank 0's at
    step 0, and the verdict says so."""
    import subprocess
    import sys

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("tensor parallel 2 on a CPU binds one core per rank: needs 2 cores")
    p = subprocess.run([sys.executable, "-c", ONE_RANK, str(tmp_path / "tp2")],
                       capture_output=True, text=True, timeout=900,
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    line = next((x for x in p.stdout.splitlines() if x.startswith("VERDICT ")), None)
    assert p.returncode == 0 and line, (p.returncode, p.stdout[-2000:], p.stderr[-4000:])
    v = json.loads(line[len("VERDICT "):])
    assert v["verdict"] == "honored"  # the returned output is rank 0's
    ag = v["ranks"]
    assert ag["agree"] is False and ag["reference"] == "pp0/tp0"
    first = {d["field"]: d for d in ag["differences"] if d["step"] == 0}
    assert first["gate"]["rank"] == "pp0/tp1" and first["gate"]["value"] is False
    assert first["emitted"]["reference"] != first["emitted"]["value"]
    assert "rank pp0/tp1 disagrees" in v["summary"] and "finding of its own" in v["summary"]
