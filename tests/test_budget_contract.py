"""The budget contract both ways (``workbook.core.budget``), table-driven, and the probe logic
derived from the catalogue (``workbook.run.budget.diagnose.pointed_by`` / ``with_probes``).

The budget forces ``</think>`` where it binds — and nowhere else. An end the model writes
itself before the budget binds is legal (a natural end); the same token *forced* there is a
violation (``early``), as is a forcing into a request without a budget (``unbudgeted``) or
after reasoning had ended (``twice``). Only a trace knows which positions were forced: the
rule takes them as ``forced`` output indices. Markers as in ``tests/test_budget.py``:
``<think>`` = 1, ``</think>`` = 3.
"""

from __future__ import annotations

import pytest

from workbook.core.budget import Markers, forced_not_due, judge
from workbook.core.hypotheses import HYPOTHESES
from workbook.run import verdicts
from workbook.run.budget import diagnose

M = Markers(start=[1], end=[3])
M2 = Markers(start=[1], end=[5, 6, 3], natural_end=[3])  # a multi-token forced end
P = [9, 1, 0]  # prompt ending "<think>\n": one reasoning token

# name, prompt, output, budget, markers, forced -> honored, kind, at
TABLE = [
    ("due force at the budget", P, [0, 0, 3, 0], 3, M, [2], True, None, None),
    ("natural end before the budget (model's own)", P, [0, 3, 0, 0], 3, M, [], None, None,
     None),
    ("the same end forced before the budget", P, [0, 3, 0, 0], 3, M, [1], False, "early", 1),
    ("forced at the first row, budget 6", P, [3, 0, 0, 0, 0, 0], 6, M, [0], False, "early",
     0),
    ("forced into a request without a budget", P, [0, 0, 3, 0], None, M, [2], False,
     "unbudgeted", 2),
    ("natural end, no budget: nothing to judge", P, [0, 0, 3, 0], None, M, [], None, None,
     None),
    ("forced twice: again after the due end", P, [0, 0, 3, 0, 3], 3, M, [2, 4], False,
     "twice", 4),
    ("forced after the model's own early end", P, [3, 0, 3], 5, M, [2], False, "twice", 2),
    ("the due end missing (first side) wins when earlier", P, [0, 0, 0, 0, 3], 3, M, [4],
     False, "missing", 2),
    ("early forcing before a missing end", P, [0, 3, 0, 0], 3, M, [1], False, "early", 1),
    ("multi-token end forced where due", P, [0, 5, 6, 3, 0], 2, M2, [1, 2, 3], True, None,
     None),
    ("multi-token end forced one early", P, [5, 6, 3, 0], 2, M2, [0, 1, 2], False, "early",
     0),
    ("budget 0, prompt already over it", [1, 0, 0], [3, 0], 0, M, [0], True, None, None),
    ("prompt not in reasoning, forced anyway", [9, 1, 0, 3], [3, 0], 1, M, [0], False,
     "early", 0),
    ("forced index past the output is ignored", P, [0, 0, 3], 3, M, [7], True, None, None),
]


@pytest.mark.parametrize("name,prompt,output,budget,markers,forced,honored,kind,at", TABLE,
                         ids=[t[0] for t in TABLE])
def test_contract_both_ways(name, prompt, output, budget, markers, forced, honored, kind, at):
    j = judge(prompt, output, budget, markers, forced)
    assert (j.honored, j.kind, j.at) == (honored, kind, at)


def test_without_forcing_evidence_the_rule_is_unchanged():
    """The client sees no forcing: an early end is the model's own (inconclusive), as before."""
    assert judge(P, [0, 3, 0, 0], 3, M).honored is None
    assert judge(P, [0, 0, 3, 0], 3, M).honored is True
    assert forced_not_due(1, [0, 0, 3], 3, M, []) is None


def test_budgets_read_back_are_ints():
    """A trace table where one request has no budget reads the others' as floats (pandas);
    the diagnosis gets ints back before any rule, text or probe sees them."""
    import pandas as pd

    df = pd.DataFrame([{"req_id": "a", "budget_param": 1, "max_tokens": 12},
                       {"req_id": "b", "budget_param": None, "max_tokens": 12}])
    assert df["budget_param"].dtype == float  # what pandas does
    recs = verdicts.records(df)
    assert [r["budget_param"] for r in recs] == [1, None]
    assert type(recs[0]["budget_param"]) is int and type(recs[0]["max_tokens"]) is int


# ---- probes: positive evidence derived from the catalogue; a contradiction refutes ---------

@pytest.mark.parametrize("probe,points", [
    ("alone", ["H-j"]), ("markers", ["H-i", "H-i-inband"]), ("budget", ["H-d"]),
    ("caches", ["H-d-cache"]), ("no_spec", []), ("guard", []), ("v1", []), ("batched", []),
])
def test_positive_evidence_is_derived_from_predictions(probe, points):
    assert diagnose.pointed_by(probe) == points
    for h in points:  # every hypothesis it points to predicts it, every other the opposite
        assert HYPOTHESES[h].predicts[probe] == "honored"


def verdict_name(hyp: str) -> dict:
    h = HYPOTHESES[hyp]
    return {"verdict": "violated", "hypothesis": hyp,
            "first_violation": {"budget": 1, "step": 0, "local_pos": 0, "path": "x",
                                "batch_size": 3, "kind": "missing", "expected_token": 3,
                                "emitted_token": 0},
            "causes": [{"hypothesis": hyp, "title": h.title, "stage": h.stage, "saw": "seen",
                        "confirm": h.confirm}], "violations": [{}], "anomalies": [],
            "requests": []}


def test_a_contradicting_probe_refutes_never_confirms():
    """The issue's case: H-d named, the budget re-copy probe stays violated (H-d predicts
    honored) — H-d is refuted, not "confirmed as a re-corrupting writer"."""
    after = diagnose.with_probes(verdict_name("H-d"), {
        "budget": {"verdict": "violated", "switch": "b", "hypothesis": "H-d",
                   "causes": ["H-d"], "recorrupted": None},
        "guard": {"verdict": "honored", "switch": "g"}})
    assert after["hypothesis"] == "unclassified", after["summary"]
    assert after["refuted"][0]["hypothesis"] == "H-d"
    assert after["refuted"][0]["refuted_by"] == ["budget"]
    assert "confirmed" not in after["summary"]
    assert [r["status"] for r in after["chain"]] == ["refuted by budget"]


def test_recorruption_needs_the_repaired_value_seen_changed_again():
    """With positive evidence (the probe's own trace saw the repaired value wrong again after
    the repair) the cause stays, reported as a re-corrupting writer."""
    seen = "step 2: device budget -1, host 1"
    after = diagnose.with_probes(verdict_name("H-d"), {
        "budget": {"verdict": "violated", "switch": "b", "recorrupted": seen},
        "guard": {"verdict": "honored", "switch": "g"}})
    c = after["causes"][0]
    assert after["hypothesis"] == "H-d" and c["reproduced_by"] == ["budget"]
    assert c["refuted_by"] == [] and c["confirmed_by"] == ["guard"]
    assert seen in after["summary"] and "re-corrupts" in after["summary"]
    assert "re-corrupted" in after["chain"][0]["result"]


def test_a_matching_probe_confirms_and_a_positive_one_adds_its_cause():
    after = diagnose.with_probes(verdict_name("H-d-kernel"), {
        "alone": {"verdict": "honored", "switch": "a"},
        "guard": {"verdict": "honored", "switch": "g"}})
    assert after["hypothesis"] == "H-j" and after["causes"][0]["from_probe"] == "alone"
    assert after["refuted"][0]["hypothesis"] == "H-d-kernel"


def test_on_the_forced_side_the_guard_predicts_nothing():
    """The guard forces a due end; it cannot take back an end forced where not due: on that
    side of the contract its result neither confirms nor refutes."""
    v = verdict_name("H-d-kernel")
    v["first_violation"]["kind"] = "early"
    after = diagnose.with_probes(v, {"guard": {"verdict": "violated", "switch": "g"}})
    assert after["hypothesis"] == "H-d-kernel" and after["causes"][0]["refuted_by"] == []
    assert after["chain"][0]["result"] == "guard: violated"
