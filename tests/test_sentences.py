"""Every sentence the diagnosis prints, from every template, with every slot filled by the values
its evidence can take (no engine: the templates are pure functions of the evidence).

A sentence fails when a slot is left empty or unreadable (``None``, ``nan``, ``null``, ``?``,
``[]``, ``{}``, a Python / JSON list or dict, ``=`` with nothing after it), when a clause has no
verb (the fragment "the rows / slots the call or the kernel got" was one), or when it claims
what its evidence contradicts: a start marker "lost" where the cache holds it, no "past the
committed history" where a cached position is past it, batch composition "not excluded" after
the batch-of-one probe settled it.

The templates: every stage rule (``stages.RULES``, ``stages.FORCING_RULES``) over a scenario
that makes it fire, each evidence field of the scenario swept over its domain one at a time
(None where the tracer can miss it, 0, small and large ids, -1, lists empty and long, marker
dicts empty and zeroed, booleans) plus seeded random combinations; the cache sentence over
histories and caches the tracer computes them from (``budget.scan_marker_cache``); the mapping
sentence over every mapping that can disagree; the probe feedback over every probe result;
the trace-wide contract checks, the summary, the chain, the server check's text and the
report's wording of verdicts recorded before sentences were in words.
"""

from __future__ import annotations

import itertools
import json
import random
import re

import pytest

from workbook.core import budget
from workbook.core.hypotheses import HYPOTHESES
from workbook.report import wording
from workbook.run import verdicts
from workbook.run.budget import diagnose
from workbook.run.budget import evidence_text
from workbook.run.servers import check as servercheck
from workbook.run.budget import stages

M = budget.Markers(start=[368], end=[369], natural_end=[369])
CONFIG = M.to_dict()
FORCED = budget.FORCED_LOGIT

# ---- what a sentence may not hold -------------------------------------------------------------

EMPTY = [
    (r"\bNone\b", "None"), (r"(?i)\bnan\b", "nan"), (r"\bnull\b", "null"),
    (r"\bundefined\b", "undefined"), (r"\[\s*\]", "[]"), (r"\{\s*\}", "{}"),
    (r"\(\s*\)", "()"), (r"\{\s*['\"]", "a dict repr"), (r"(?<![\w\]])\[", "a list repr"),
    (r"=\s*(?:[,;:)]|$)", "an empty slot after ="), (r"(?:^|\s)\?(?:\s|$|[,;)])", "?"),
    (r"\bat step\s*[,;:)]", "a step left empty"), (r"\b(?:at|to) slot\s*(?:[,;:)(]|$)", "a slot left empty"),
    (r"\bat position\s*[,;:)]", "a position left empty"),
]
FRAGMENTS = ("the rows / slots the call or the kernel got",)
VERBS = re.compile(
    r"\b(is|are|was|were|has|had|have|held|holds|hold|read|reads|got|get|sent|named|ran|"
    r"launched|left|put|produced|sampled|emitted|committed|says|gives|asked|carried|"
    r"registered|wrote|moved|changed|went|indexed|stopped|lies|confirmed|refuted|took|"
    r"ignores|accepted|computed|handed|stayed|restarts|yield|gave|served|sits|won|"
    r"differ|differs|fits|fit|bound|violated|honored|forced|skipped|traced|found|reached|"
    r"agreed|batched|ended|did|does|lost|expected|kept|went)\b")


def problems(text: str, *, clauses: bool = True) -> list[str]:
    """What is wrong with one sentence ([] when nothing)."""
    if not isinstance(text, str) or not text.strip():
        return ["an empty sentence"]
    out = [f"{what}: {text!r}" for rx, what in EMPTY if re.search(rx, text)]
    out += [f"a fragment without a verb ({f!r}): {text!r}" for f in FRAGMENTS if f in text]
    if clauses:
        # every clause of four words or more says something (a verb): "; " and ": " part them
        for clause in re.split(r"; |: | — ", text):
            bare = re.sub(r"\([^()]*\)", "", clause)
            if len(bare.split()) >= 4 and not VERBS.search(bare):
                out.append(f"a clause without a verb {clause!r} in {text!r}")
    return out


RENDERED: dict[str, int] = {}  # template -> sentences rendered (the coverage, printed at the end)


def check(template: str, texts, **kw) -> None:
    texts = [texts] if isinstance(texts, str) else list(texts)
    RENDERED[template] = RENDERED.get(template, 0) + len(texts)
    bad = [p for t in texts for p in problems(t, **kw)]
    assert not bad, bad[:5]


# ---- the evidence a rule reads, and the values each field can take ----------------------------

INTS = (None, 0, 1, 17, -1, 248069, 2 ** 31 - 1)
BOOLS = (None, True, False)
LISTS = (None, [], [369], [248068, 248069])
MARKER_DICTS = (None, {}, {"start": [0], "end": [0], "natural_end": [0]}, CONFIG,
                {"start": [248068, 5], "end": [], "natural_end": [248069]})
FLOATS = (None, 0.0, -3.5, 98.5, 5.0, FORCED, 2e9)
DOMAIN = {}
for k in ("slot", "batch_slot", "batch_size", "batch_pos", "budget_host",
          "budget_device", "total_len_before", "total_len_dev", "truth_start", "last_start",
          "last_end", "scan_pos", "last_start_before", "last_end_before", "scan_pos_before",
          "cache_ref_start", "kernel_budget", "kernel_total_len", "row", "local_pos",
          "sampled_vllm", "emitted_token", "count_host", "due_token", "sampled_top"):
    DOMAIN[k] = INTS
for k in ("enabled", "use_thinking_budget", "gate", "fast_path", "apply_called",
          "kernels_launched", "markers_ok", "history_ok", "mapping_ok", "positions_ok",
          "cache_before_ok", "cache_after_ok", "cache_scan_ok", "kernel_history_ok",
          "markers_moved", "markers_base_ok", "due", "from_draft", "sampled_is_biased",
          "returned_is_biased", "emitted"):
    DOMAIN[k] = BOOLS
for k in ("bias_cols", "kernel_substituted", "markers_version", "markers_version0",
          "topk_ids_after"):
    DOMAIN[k] = LISTS
for k in ("step", "row", "local_pos"):  # the keys of every record: always an int
    DOMAIN[k] = (0, 1, 17, 2 ** 31 - 1)
DOMAIN["markers_version"] = (None, [0, 0, 0], [0, 2, 0], [None, None, None])
DOMAIN["markers_version0"] = DOMAIN["markers_version"]
for k in ("markers_dev", "kernel_markers"):
    DOMAIN[k] = MARKER_DICTS
for k in ("due_logit_before_apply", "due_logit_after_apply", "end_logit_before_apply",
          "end_logit_after_apply", "end_logit_final", "due_logit_kernel", "due_logit_sampled",
          "sampled_top_logit"):
    DOMAIN[k] = FLOATS
DOMAIN["topk_vals_after"] = (None, [], [98.5], [FORCED, 3.0])
DOMAIN["path"] = (None, "Sampler", "RejectionSampler")
DOMAIN["mapping_slots"] = (
    None, {}, {"rows": [4, 5], "expanded": [2, 2], "gate": 1, "idx_dev": 1, "kernel_req": 1,
               "kernel_rows": None, "kernel_n": None, "n": 9, "index_moved": False},
    {"rows": [4], "expanded": [1], "gate": 0, "idx_dev": None, "kernel_req": 7,
     "kernel_rows": [3], "kernel_n": 8, "n": 9, "index_moved": True})
REQ_DOMAIN = {"budget": (None, 0, 1, 23, 2 ** 31 - 1), "budget_runner": (None, 3),
              "kind": (None, "missing", "early", "unbudgeted", "twice")}

BASE_ST = {"step": 2, "req_id": "r", "slot": 1, "batch_slot": 1, "batch_size": 3, "batch_pos": 1,
           "path": "RejectionSampler", "enabled": True, "use_thinking_budget": True,
           "budget_host": 3, "budget_device": 3, "gate": True, "fast_path": False,
           "apply_called": True, "kernels_launched": True, "markers_ok": True,
           "history_ok": True, "mapping_ok": True, "positions_ok": True,
           "cache_before_ok": True, "cache_after_ok": True, "cache_scan_ok": True,
           "total_len_before": 40, "total_len_dev": 40, "truth_start": 17, "last_start": 17,
           "last_end": -1, "scan_pos": 40, "last_start_before": 17, "last_end_before": -1,
           "scan_pos_before": 39, "cache_ref_start": 17, "markers_dev": CONFIG,
           "markers_version": [0, 0, 0], "markers_version0": [0, 0, 0], "markers_moved": False,
           "markers_base_ok": True}
BASE_ROW = {"step": 2, "req_id": "r", "row": 5, "local_pos": 1, "due": True, "due_token": 369,
            "count_host": 3, "emitted_token": 198, "sampled_vllm": 198, "emitted": True,
            "from_draft": True, "bias_cols": [], "due_logit_before_apply": 1.5,
            "due_logit_after_apply": 1.5, "end_logit_before_apply": 1.5,
            "end_logit_after_apply": 1.5, "end_logit_final": 1.5, "due_logit_kernel": None,
            "due_logit_sampled": None, "sampled_top": 198, "sampled_top_logit": 98.5,
            "topk_ids_after": [198], "topk_vals_after": [98.5]}
PREV = {**BASE_ST, "step": 1, "cache_after_ok": False, "last_start": -1, "last_end": -1}

# one scenario per rule branch: (request, step, row, previous step) overrides that make it fire
SCENARIOS = {
    "state": ({}, {"enabled": False}, {}, None),
    "registration/runner": ({"budget_runner": None}, {}, {}, None),
    "registration": ({}, {"use_thinking_budget": False, "budget_host": -1}, {}, None),
    "mapping/idx": ({}, {"mapping_ok": False, "batch_slot": 2}, {}, None),
    "mapping/other": ({}, {"mapping_ok": False}, {}, None),
    "mapping/recorded": ({}, {"mapping_ok": False, "mapping_slots": DOMAIN["mapping_slots"][2]},
                         {}, None),
    "gate/never": ({}, {"gate": None, "apply_called": None}, {}, None),
    "gate/off": ({}, {"gate": False}, {}, None),
    "gate/fast path": ({}, {"fast_path": True}, {}, None),
    "gate/apply not called": ({}, {"apply_called": False}, {}, None),
    "launch": ({}, {"kernels_launched": False}, {}, None),
    "device/markers": ({}, {"markers_ok": False, "markers_dev": MARKER_DICTS[2]}, {}, None),
    "device/markers inband": ({}, {"markers_ok": False, "markers_version": [0, 2, 0]}, {},
                              None),
    "device/budget": ({}, {"budget_device": 0}, {}, None),
    "device/history": ({}, {"history_ok": False, "total_len_dev": 12}, {}, None),
    "device/cache": ({}, {"cache_before_ok": False, "last_start_before": 17,
                          "last_end_before": 500, "cache_ref_start": -1}, {}, None),
    "device/cache prev markers": ({}, {"cache_before_ok": False, "cache_ref_start": -1},
                                  {}, {"markers_ok": False}),
    "device/cache prev history": ({}, {"cache_before_ok": False, "cache_ref_start": -1},
                                  {}, {"history_ok": False, "total_len_dev": 3}),
    "device/cache prev scan": ({}, {"cache_before_ok": False, "cache_ref_start": -1}, {},
                               {"cache_scan_ok": None}),
    "device/cache prev changed": ({}, {"cache_before_ok": False, "cache_ref_start": -1}, {},
                                  {"kernels_launched": False}),
    "device/cache prev right": ({}, {"cache_before_ok": False, "cache_ref_start": 30}, {},
                                {"cache_after_ok": True}),
    "kernel/other tensor": ({}, {}, {"due_logit_kernel": FORCED}, None),
    "kernel/column": ({}, {}, {"bias_cols": [370]}, None),
    "kernel/inputs": ({}, {"kernel_markers": MARKER_DICTS[2], "kernel_budget": 0,
                           "kernel_history_ok": False, "kernel_total_len": 3}, {}, None),
    "kernel/cache after scan": ({}, {"cache_after_ok": False, "cache_scan_ok": True}, {}, None),
    "kernel/scan": ({}, {"cache_after_ok": False, "cache_scan_ok": False}, {}, None),
    "kernel/unforced batched": ({}, {}, {}, None),
    "kernel/weak bias": ({}, {}, {"due_logit_after_apply": 6.5}, None),
    "kernel/tie": ({}, {}, {"due_logit_after_apply": FORCED, "bias_cols": [369, 370],
                            "emitted_token": 370}, None),
    "sampling/column moved": ({}, {}, {"due_logit_after_apply": FORCED, "due_logit_sampled": 1.0,
                                       "sampled_top": 370, "sampled_top_logit": FORCED}, None),
    "sampling/not sampled": ({}, {}, {"due_logit_after_apply": FORCED, "due_logit_sampled": 1.0,
                                      "sampled_is_biased": False}, None),
    "sampling/own sample": ({}, {}, {"due_logit_after_apply": FORCED,
                                     "due_logit_sampled": FORCED, "from_draft": False}, None),
    "sampling/draft": ({}, {}, {"due_logit_after_apply": FORCED,
                                "due_logit_sampled": FORCED}, None),
    "commit": ({}, {}, {"due_logit_after_apply": FORCED, "due_logit_sampled": FORCED,
                        "sampled_vllm": 369, "emitted_token": 198}, None),
    "forced/kernel": ({"kind": "early"}, {}, {"due": False, "due_token": None,
                                              "bias_cols": [369], "emitted_token": 369,
                                              "sampled_vllm": 369, "count_host": 1}, None),
    "forced/commit": ({"kind": "unbudgeted", "budget": None}, {"budget_host": -1,
                                                              "use_thinking_budget": False},
                      {"due": False, "due_token": None, "sampled_vllm": 198,
                       "emitted_token": 369}, None),
}


def ctx(req_over, st_over, row_over, prev_over, extra_rows=()):
    st = {**BASE_ST, **st_over}
    row = {**BASE_ROW, **row_over}
    steps = [st]
    if prev_over is not None:
        steps = [{**PREV, **prev_over}, st]
    req = {"req_id": "r", "budget": 3, "kind": "missing", "registration": {
        "enabled": True, "use_thinking_budget": True, "budget_host": 3}, "steps": steps,
        **req_over}
    if "budget_runner" in req_over:
        req["budget"] = 3
    rows = [row, *extra_rows]
    return stages.Ctx(req=req, st=st, lp=row["local_pos"], row=row, rows_by_pos={
        row["local_pos"]: row}, rows=rows, steps=steps, markers=M, config_markers=CONFIG,
        path_of={st["step"]: st["path"]})


def variants(name):
    """The scenario, then each field of its step / row / request swept over its domain."""
    req_o, st_o, row_o, prev_o = SCENARIOS[name]
    yield req_o, st_o, row_o, prev_o
    for k, dom in DOMAIN.items():
        for v in dom:
            if k in BASE_ST or k in st_o or k in ("mapping_slots", "kernel_markers",
                                                     "kernel_budget", "kernel_total_len",
                                                     "kernel_history_ok",
                                                     "kernel_substituted"):
                yield req_o, {**st_o, k: v}, row_o, prev_o
            if k in BASE_ROW or k in row_o or k in ("sampled_is_biased", "returned_is_biased"):
                yield req_o, st_o, {**row_o, k: v}, prev_o
            if prev_o is not None and k in BASE_ST:
                yield req_o, st_o, row_o, {**prev_o, k: v}
    for k, dom in REQ_DOMAIN.items():
        for v in dom:
            yield {**req_o, k: v}, st_o, row_o, prev_o
    rnd = random.Random(name)
    for _ in range(40):  # random combinations of several fields at once
        st, row = dict(st_o), dict(row_o)
        for k in rnd.sample(sorted(DOMAIN), 6):
            (st if k in BASE_ST else row)[k] = rnd.choice(DOMAIN[k])
        yield req_o, st, row, prev_o


def _fires(name) -> list[dict]:
    rules = stages.FORCING_RULES if name.startswith("forced/") else stages.RULES
    return [c for _n, rule in rules for c in rule(ctx(*SCENARIOS[name]))]


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_every_rule_sentence_has_every_slot_filled(name):
    """Each scenario fires its rule (the template is reached), and every variant of its
    evidence renders sentences with no empty slot and a verb in every clause."""
    assert _fires(name), f"scenario {name} fires no rule: it tests nothing"
    rules = stages.FORCING_RULES if name.startswith("forced/") else stages.RULES
    n = 0
    for req_o, st_o, row_o, prev_o in variants(name):
        c = ctx(req_o, st_o, row_o, prev_o)
        for cse in [x for _n, rule in rules for x in rule(c)]:
            check(f"rule {name}", cse["saw"])
            check("titles", cse["title"], clauses=False)
            n += 1
    assert n > 0


# ---- 1. the cache sentence: from the history and the cache the tracer reads -------------------

def _cache_step(hist, cache, step=5):
    ls, le, sp = cache
    truth = budget.last_start(hist, M)
    ref = budget.scan_marker_cache(hist, sp, ls, le, M)
    return {"step": step, "total_len_before": len(hist), "truth_start": truth,
            "last_start_before": ls, "last_end_before": le, "scan_pos_before": sp,
            "cache_ref_start": budget.cache_start(ref[0], ref[1]),
            "cache_before_ok": budget.cache_start(ref[0], ref[1]) == truth}


def _cache_claims(st, text):
    """What the sentence claims, against what the step's values show."""
    n, truth = st["total_len_before"], st["truth_start"]
    ls, le, sp, ref = (st["last_start_before"], st["last_end_before"], st["scan_pos_before"],
                       st["cache_ref_start"])
    wrong = []
    past = [v for v in (ls, le) if v >= n] + ([sp] if sp > n else [])
    if not past and "past the committed history" in text:
        wrong.append("says a cached position is past the history, none is")
    for what, v in (("start", ls), ("end", le)):
        said = f"the cached {what} position {v} is past the committed history's length {n}"
        if (v >= n) != (said in text):
            wrong.append(f"{what} position {v} vs length {n}")
    if truth >= 0 and ls == truth and re.search(r"lost|no start position|not the history's "
                                                r"start", text):
        wrong.append("says the start marker is lost or moved, the cache holds it")
    if truth >= 0 and ls == truth and "is the history's start marker" not in text:
        wrong.append("does not say the cache holds the start marker")
    if "no start position" in text and not (ls < 0 <= truth):
        wrong.append("says no start position, the cache holds one or none is due")
    says_out = "the cache says not in reasoning" in text
    if says_out != (ref < 0):
        wrong.append(f"says {'not ' if says_out else ''}in reasoning, the replay gives {ref}")
    if "restarts" in text and not (0 <= truth < ref < n):
        wrong.append("says the count restarts, the replayed start is not later")
    if truth < 0 and "the committed history is not in reasoning" not in text:
        wrong.append("does not say the history is not in reasoning")
    if truth >= 0 and f"opened at its start marker at position {truth}" not in text:
        wrong.append("does not say where the history's reasoning opened")
    return wrong


def test_cache_sentence_says_what_the_cached_values_show():
    """The fault written outside the workbook: the cached end position past the committed
    history, the start marker cached right. The sentence names the cached end and the length,
    says the start is the history's, and never that it was lost."""
    hist = [5] * 17 + [368] + [7] * 22  # 40 tokens, reasoning opened at 17
    st = _cache_step(hist, (17, 500, 39), step=41)
    assert st["cache_before_ok"] is False and st["truth_start"] == 17
    text = evidence_text.cache_saw(st)
    check("cache_saw", text)
    assert "the cached end position 500 is past the committed history's length 40" in text
    assert "the cached start position 17 is the history's start marker" in text
    assert "lost" not in text and "no start position" not in text, text
    assert _cache_claims(st, text) == []
    # the same step through the rules: the device-state stage names it with that sentence
    c = ctx({}, {**st, "cache_before_ok": False}, {}, None)
    causes = stages.classify(c)
    assert [x["hypothesis"] for x in causes] == ["H-d-cache"] and text in causes[0]["saw"]


@pytest.mark.parametrize("seed", range(6))
def test_cache_sentence_over_histories_and_caches(seed):
    """Histories with and without reasoning (one- and two-token markers ahead of them), caches
    right, lost, moved, stale, past the history: every wrong cache's sentence has its slots
    filled and claims only what the values show."""
    rnd = random.Random(seed)
    n_wrong = 0
    for _ in range(150):
        n = rnd.randint(1, 60)
        hist = [rnd.choice([5, 6, 7, 7, 7, 368, 369]) for _ in range(n)]
        right = budget.scan_marker_cache(hist, 0, -1, -1, M)
        choices = (-1, 0, right[0], right[1], rnd.randrange(n), n, n + rnd.randint(1, 500),
                   2 ** 31 - 1)
        ls, le = rnd.choice(choices), rnd.choice(choices)
        sp = rnd.choice((0, right[2], rnd.randrange(n + 1), n, n + 3))
        st = _cache_step(hist, (ls, le, sp))
        if st["cache_before_ok"]:
            continue
        n_wrong += 1
        text = evidence_text.cache_saw(st)
        check("cache_saw", text)
        assert _cache_claims(st, text) == [], (st, text)
    assert n_wrong > 20


@pytest.mark.parametrize("missing", ["total_len_before", "truth_start", "last_start_before",
                                     "last_end_before", "scan_pos_before", "cache_ref_start"])
def test_cache_sentence_with_a_value_missing(missing):
    st = {**_cache_step([5] * 17 + [368] + [7] * 22, (17, 500, 39)), missing: None}
    check("cache_saw", evidence_text.cache_saw(st))


# ---- 2. the mapping sentence ------------------------------------------------------------------

ELSEWHERE = "the kernel read another slot's state for this request's rows"
NOT_PROCESSED = "the kernel did not process this request's rows at its own slot"
MAPPINGS = [  # (evidence, what the sentence must say, its consequence)
    ({"batch_slot": 2}, ["the batch's idx_mapping named slot 2"], ELSEWHERE),
    ({"batch_slot": 1}, ["the batch's idx_mapping named its slot 1", "does not record"],
     "the kernel did not read this request's own slot for its rows"),
    ({"batch_slot": None}, ["idx_mapping was not recorded"],
     "the kernel did not read this request's own slot for its rows"),
    ({"mapping_slots": {"rows": [4, 5], "expanded": [2, 2], "gate": 1, "idx_dev": 1}},
     ["expanded_idx_mapping (as apply_sampling_params got it) sent row 4 to slot 2, row 5 to "
      "slot 2"], ELSEWHERE),
    ({"mapping_slots": {"rows": [4, 5], "expanded": [1, 1], "gate": 0}},
     ["the per-request gate named slot 0"], ELSEWHERE),
    ({"mapping_slots": {"rows": [4], "expanded": [1], "gate": 1, "idx_dev": 3}},
     ["the device copy of idx_mapping named slot 3"], ELSEWHERE),
    ({"mapping_slots": {"rows": [4], "expanded": [1], "gate": 1, "kernel_req": 0}},
     ["the marker-scan kernel named slot 0"], ELSEWHERE),
    ({"mapping_slots": {"rows": [4, 5], "expanded": [1, 1], "gate": 1,
                        "kernel_rows": [1, 2147483647]}},
     ["the kernel's own row mapping sent row 5 to slot 2147483647"], ELSEWHERE),
    ({"mapping_slots": {"rows": [4], "expanded": [1], "gate": 1, "kernel_n": 5, "n": 15}},
     ["the kernel's own row mapping held 5 of the batch's 15 rows"], NOT_PROCESSED),
    ({"mapping_slots": {"rows": [4], "expanded": [1], "gate": 1, "index_moved": True}},
     ["req_id_to_index stopped naming the slot"], NOT_PROCESSED),
    ({"mapping_slots": {"rows": [4], "expanded": [1], "gate": 1, "idx_dev": None}},
     ["held no entry for this request"], NOT_PROCESSED),
    ({"batch_slot": 0, "mapping_slots": {"rows": [0, 1, 2], "expanded": [0, 0, 0], "gate": 0,
                                         "idx_dev": 0, "kernel_req": 0}},
     ["the batch's idx_mapping, expanded_idx_mapping (as apply_sampling_params got it), the "
      "device copy of idx_mapping, the per-request gate and the marker-scan kernel all sent "
      "its rows 0, 1, 2 to slot 0"], ELSEWHERE),
]


@pytest.mark.parametrize("over,said,then", MAPPINGS)
@pytest.mark.parametrize("slot", [1, None])
def test_mapping_sentence_names_the_slots(over, said, then, slot):
    """Which mapping named which slot, the slot the host registered, and the consequence the
    evidence shows: another slot's state read only where a mapping named another slot."""
    st = {**BASE_ST, "mapping_ok": False, "slot": slot, **over}
    causes = stages.classify(ctx({}, st, {}, None))
    assert [c["hypothesis"] for c in causes] == ["H-j"]
    text = causes[0]["saw"]
    check("mapping", text)
    check("mapping", [a["saw"] for a in diagnose.contract_breaks(_frames(
        {"mapping_ok": False, "slot": slot, **over}, {}), M)])
    assert f"registered the request at slot {'1' if slot == 1 else 'not recorded'}" in text
    if slot == 1:
        assert all(s in text for s in said), (said, text)
        assert text.endswith(then), text


# ---- 3. batch composition: the reason follows the batch-of-one probe --------------------------

def _batched_verdict():
    """A due row without its +1e9, inputs right, in a batch of 3 where no due row at that
    place was forced: H-d-kernel and H-j (batch composition) both fit."""
    c = ctx({}, {}, {}, None)
    causes = stages.classify(c)
    assert [x["hypothesis"] for x in causes] == ["H-d-kernel", "H-j"], causes
    v = {"verdict": "violated", "requests": [{}, {}, {}], "violations": [], "anomalies": [],
         "first_violation": {"req_id": "r", "budget": 3, "kind": "missing", "step": 2,
                             "local_pos": 1, "path": "RejectionSampler", "row": 5,
                             "expected_token": 369, "emitted_token": 198, "batch_size": 3},
         "causes": [{**x, "requests": ["r"]} for x in causes]}
    diagnose._name(v)
    v["chain"] = verdicts.chain_rows(v)
    return v


PROBE_RESULTS = {
    "not run": None,
    "not applicable": {"alone": {"switch": "alone", "ran": False, "why": "no violating request"}},
    "failed": {"alone": {"switch": "alone", "ran": False, "why": None}},
    "inconclusive": {"alone": {"switch": "alone", "ran": True, "verdict": "inconclusive"}},
    "confirmed": {"alone": {"switch": "alone", "ran": True, "verdict": "honored"}},
    "refuted": {"alone": {"switch": "alone", "ran": True, "verdict": "violated"}},
}


@pytest.mark.parametrize("result", list(PROBE_RESULTS))
def test_batch_composition_reason_follows_the_probe(result):
    v = _batched_verdict()
    probes = PROBE_RESULTS[result]
    after = diagnose.with_probes(v, probes) if probes is not None else v
    hj = next(c for c in after["causes"] + after.get("refuted", []) if c["hypothesis"] == "H-j")
    texts = [hj["saw"], after["reason"], after["summary"]] + \
        [r["anomaly"] for r in after["chain"]] + [r["cause"] for r in after["chain"]]
    check("probe feedback", texts)
    if result == "confirmed":
        assert after["hypothesis"] == "H-j", after["summary"]
        assert "confirmed it: alone, the request was honored" in after["reason"]
        assert "not excluded" not in after["reason"] and "not excluded" not in hj["saw"]
    elif result == "refuted":
        assert hj in after["refuted"] and "refuted it" in hj["saw"]
        assert "not excluded" not in hj["saw"] and after["hypothesis"] == "H-d-kernel"
    else:
        assert "batch composition is not excluded" in hj["saw"]
        assert "confirmed" not in hj["saw"] and "refuted" not in hj["saw"]
        if result == "not applicable":
            assert "did not run (no violating request)" in hj["saw"]


def test_batch_composition_title_says_what_the_cause_is():
    """The catalogue's title names the cause (the batch did not hand the request's rows to the
    kernel at its slot), not an effect ("forcing depends on ...")."""
    t = HYPOTHESES["H-j"].title
    assert "depends on" not in t and "rows" in t and "slot" in t, t
    check("titles", [h.title for h in HYPOTHESES.values()], clauses=False)


# ---- the trace-wide checks, the summary, the verdicts written before ---------------------------

def _frames(st_over, row_over, budget_param=3):
    import pandas as pd

    st = {**BASE_ST, **st_over}
    row = {**BASE_ROW, **row_over}
    for d in (st, row):
        for k in ("markers_dev", "kernel_markers", "mapping_slots"):
            if isinstance(d.get(k), dict):
                d[k] = json.dumps(d[k])
    return {"registrations": pd.DataFrame([{"req_id": "r", "budget_param": budget_param}]),
            "requests": pd.DataFrame([st]), "rows": pd.DataFrame([row]),
            "steps": pd.DataFrame([{"step": st["step"], "path": st["path"]}])}


BREAKS = [
    ({"mapping_ok": False, "batch_slot": 2}, {}), ({"mapping_ok": False}, {}),
    ({"enabled": False}, {}), ({"use_thinking_budget": False, "budget_host": None}, {}),
    ({"gate": False, "fast_path": None, "apply_called": None}, {}),
    ({"kernels_launched": False}, {}), ({"markers_ok": False, "markers_dev": {}}, {}),
    ({"budget_device": 0}, {}), ({"history_ok": False, "total_len_dev": None}, {}),
    ({"positions_ok": False}, {}),
    ({"cache_before_ok": False, "last_end_before": 500, "cache_ref_start": -1}, {}),
    ({"cache_scan_ok": False, "last_start": -1}, {}),
    ({"cache_scan_ok": True, "cache_after_ok": False}, {}),
    ({"kernel_substituted": ["marker ids", "budget"]}, {}),
    ({}, {"due_logit_kernel": FORCED}), ({}, {"bias_cols": [370]}), ({}, {"count_host": None}),
    ({}, {"due_logit_after_apply": FORCED, "due_logit_sampled": 1.0}),
    ({}, {"due_logit_after_apply": FORCED, "due_logit_sampled": FORCED}),
    ({}, {"due_logit_after_apply": FORCED, "due_logit_sampled": FORCED, "from_draft": False}),
    ({}, {"due_logit_after_apply": FORCED, "due_logit_sampled": FORCED, "sampled_vllm": 369,
          "emitted_token": 198}),
    ({}, {"due": False, "bias_cols": [369], "count_host": None}),
    ({}, {"due": False, "sampled_vllm": 198, "emitted_token": 369}),
]


@pytest.mark.parametrize("st_over,row_over", BREAKS)
@pytest.mark.parametrize("budget_param", [3, None])
def test_contract_breaks_are_sentences(st_over, row_over, budget_param):
    found = diagnose.contract_breaks(_frames(st_over, row_over, budget_param), M)
    check("contract_breaks", [a["saw"] for a in found])


FV = {"req_id": "r", "budget": 3, "kind": "missing", "step": 2, "local_pos": 1,
      "path": "Sampler", "row": 5, "output_index": 7, "expected_token": 369,
      "emitted_token": 198}


@pytest.mark.parametrize("kind", ["missing", "early", "unbudgeted", "twice"])
@pytest.mark.parametrize("field", [None, "budget", "step", "local_pos", "path",
                                   "output_index", "expected_token", "emitted_token"])
@pytest.mark.parametrize("hyp", ["H-d-cache", "unclassified", "ambiguous"])
def test_summary_with_every_slot(kind, field, hyp):
    fv = {**FV, "kind": kind, **({field: None} if field else {})}
    causes = [] if hyp == "unclassified" else [
        verdicts.cause("H-d-cache", evidence_text.cache_saw(_cache_step([368, 5, 5], (0, 9, 3))))]
    if hyp == "ambiguous":
        causes.append(verdicts.cause("H-d", "the device budget 0 differs from the host "
                                            "budget 3 for slot 1 at step 2"))
    v = {"verdict": "violated", "first_violation": fv, "causes": causes, "violations": [{}],
         "anomalies": []}
    diagnose._name(v)
    check("summary", [v["summary"], v["reason"]])


@pytest.mark.parametrize("effective", [
    {"runner_class": None, "runner_is_v2": None}, {"runner_class": "GPUModelRunner",
                                                   "runner_is_v2": False}])
def test_v1_sentence(effective):
    v = diagnose.diagnose({}, effective, [{"honored": True, "token_ids": [1]}])
    check("runner", [v["summary"], v["reason"], v["causes"][0]["saw"]])


# the H200 batch's recorded sentence (outputs/h200/writer-20261203/...): a Python dict in it
RECORDED = ("at step 0 the state's device marker ids read start=[0] end=[0] natural_end=[0], "
            "configured {'start': [248068], 'end': [248069], 'natural_end': [248069]}; storage "
            "unchanged and _version [0, 0, 0] — no tracked PyTorch write put them there")


def test_report_says_recorded_reprs_in_words(tmp_path):
    from workbook.report.runs import Run

    text = wording.said(RECORDED)
    check("said", text, clauses=False)  # its words are the recorded ones: only reprs change
    assert "configured start 248068, end 248069, natural end 248069" in text
    assert wording.said("guard field tail[0] found") == "guard field tail[0] found"
    v = {"verdict": "violated", "summary": "x — H-i: " + RECORDED, "reason": RECORDED,
         "causes": [{"hypothesis": "H-i", "saw": RECORDED, "refuted_by": ["alone"]}],
         "chain": [{"anomaly": RECORDED, "cause": "H-i: t"}], "requests": [{"output": [1, 2]}]}
    run = Run("h200", "x", str(tmp_path), {"name": "n"}, {"verdict": v})
    got = run.verdict
    check("said_verdict", [got["summary"], got["reason"], got["causes"][0]["saw"],
                           got["chain"][0]["anomaly"]], clauses=False)
    assert got["requests"] == [{"output": [1, 2]}] and got["causes"][0]["refuted_by"] == \
        ["alone"]  # the data stays data
    check("views", wording.verdict_heading({"verdict": "inconclusive", "summary": RECORDED}),
          clauses=False)


# ---- the server check's text ------------------------------------------------------------------

def _server_result(prompt_count, budget_value, expected, actual, finish, usage, markers, tail):
    judged = {"verdict": "honored", "mode": "raw", "expected_end_index": expected,
              "actual_end_index": actual, "first_bad": None, "notes": [],
              "positions": [{"index": 0, "token": 5, "due": None, "forced": None,
                             "top_value": None, "status": "-", "ok": True}],
              "markers": markers, "budget": budget_value,
              "prompt_reasoning_count": prompt_count}
    return servercheck.Result(url="http://127.0.0.1:8000", model="tiny",
                              request={"max_tokens": 16, "top_logprobs": 5}, mode="raw",
                              mode_evidence={"from": "given"}, judged=judged,
                              finish_reason=finish, usage=usage, prompt_tail=tail)


def test_server_check_text():
    """Every combination of what the server's answer can leave out (576): the header lines
    have every slot filled; the prompt's reasoning count says why it is not counted."""
    n = 0
    for prompt_count, budget_value, expected, actual, finish, usage, markers, tail in \
            itertools.product([None, 0, 12], [None, 0, 3], [None, 4], [None, 4],
                              [None, "stop"], [{}, {"completion_tokens": 9}],
                              [{"start": [248068], "end": [248069]}, {"start": [], "end": []}],
                              [[], [1, 2, 248068]]):
        text = servercheck.render(_server_result(prompt_count, budget_value, expected, actual,
                                                 finish, usage, markers, tail))
        head = text.splitlines()[:5]
        check("check-server", head, clauses=False)
        if prompt_count is None:
            assert "reasoning tokens in the prompt: not counted" in head[2], head[2]
        n += 1
    assert n == 576


H200_BATCH = "outputs/h200/20261203-051624-664-5ef0e1"  # its verdicts hold a Python dict


def test_committed_h200_report_has_no_python_repr():
    """The H200 batch whose recorded sentences say "configured {'start': [248068], ...}": its
    report says the marker ids in words."""
    import html
    import os

    from workbook.report import html as rep, runs

    root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), H200_BATCH)
    if not os.path.isdir(root):
        pytest.skip(f"{H200_BATCH} is not in this checkout")
    page = rep.build([runs.load_batch(root)])
    body = re.sub(r"<script.*?</script>|<style.*?</style>", "", page, flags=re.S)
    text = html.unescape(re.sub(r"<[^>]+>", " ", re.sub(r'src="data:[^"]*"', "", body)))
    assert "configured start 248068, end 248069, natural end 248069" in text
    assert not re.search(r"\{\s*'|\bNone\b", text)


def test_zz_coverage():
    """How many sentences each template rendered (printed with -s; the report quotes it)."""
    total = sum(RENDERED.values())
    print(f"\n{len(RENDERED)} templates, {total} sentences rendered")
    for k, n in sorted(RENDERED.items()):
        print(f"  {k}: {n}")
    assert total > 0
