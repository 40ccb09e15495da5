"""What the watch, the sanitizer stage and the probe say must match what each pass really did.

Pure Python, table-driven, shaped like the H200 evidence of ``scripts/writer_gpu.sh`` (tiny,
vLLM 0.29.0): passes cut by their time limit before the profiling run, a writer seen in the
profiling run's drafter propose, memcheck logs whose NVTX permission calls the tool refused.

- a start-up that did not finish and saw no change reads ``incomplete`` (where it stopped, why,
  the phases that ran), never ``intact`` — the verdict, the printed lines, the culprit, the
  PROBE line;
- the caching A/B compares only passes that got past the phase where the other saw the change;
- refused NVTX calls: the protection was not applied and memcheck's silence says nothing;
  "invisible to memcheck" only with the protection applied;
- no ``None`` where a sentence belongs.
"""

from __future__ import annotations

import json

import pytest

from workbook.run import integrity
from workbook.run.writer import stage as sanistage
from workbook.run.writer import sanitizer
from workbook.run.writer import command as watchcmd

STARTUP = ["runner construction", "model load", "drafter load", "state creation"]
PAST_PROFILE = STARTUP + ["memory profiling", "profiling run", "KV-cache allocation"]
LAYOUT = [{"name": "reasoning_start_token_ids", "ptr": 0x7fddd94c9800, "nbytes": 4,
           "ptr_hex": "0x7fddd94c9800", "offset": 1536}]
CHANGE = {"tensor": "reasoning_start_token_ids", "role": "marker",
          "phase": "profiling run › drafter propose", "top_phase": "profiling run",
          "before": [368], "after": [0], "last_clean": "enter Speculator.propose",
          "first_dirty": "exit Speculator.propose", "ptr_moved": False, "version": [0, 0],
          "step": 0, "module": None, "op": None}
TIMED_OUT = "pass timed out after 40 s"
REFUSED_LOG = "\n".join(
    ["========= COMPUTE-SANITIZER"]
    + ["========= Warning: Call to nvtxMemPermissionsAssign failed: One or more of the "
       "parameters is invalid", "========= "] * 2
    + ["========= ERROR SUMMARY: 0 errors", ""])
CLEAN_LOG = "========= COMPUTE-SANITIZER\n========= ERROR SUMMARY: 0 errors\n"


def watch(phases, change=None, real_steps=0, tool_attached=True, protected=True, mode="nvtx"):
    return {"state_found": True, "startup_observed": True, "phase_order": list(phases),
            "phases": [{"phase": p} for p in phases], "layout": LAYOUT,
            "first_change": change, "changes": [change] if change else [],
            "first_real_step_phase": next((p for p in phases if p.startswith("step ")), None),
            "steps": {"real_steps": real_steps}, "vllm_version": "0.29.0",
            "device": "NVIDIA H200", "platform": "cuda",
            "overhead": {"startup_checks": 3, "startup_check_s": 0.0066, "step_checks": 0,
                         "step_check_s": 0.0},
            "protection": {"mode": mode, "tool_attached": tool_attached,
                           "protected": ["reasoning_start_token_ids"] if protected else []}}


# ---- 1. a start-up cut short is incomplete, never intact ----------------------------------------

@pytest.mark.parametrize("stopped,rc,why", [
    (TIMED_OUT, None, TIMED_OUT),
    (None, 1, "exited with status 1"),
    (None, None, "the watch's record ends there")])
def test_a_start_up_cut_before_its_end_reads_incomplete(stopped, rc, why):
    w = watch(STARTUP)
    v = integrity.verdict_from_watch(w, stopped, rc)
    assert v["verdict"] == "incomplete" and v["stopped_in"] == "state creation"
    assert why in v["saw"] and "stopped in state creation" in v["saw"]
    assert " → ".join(STARTUP) in v["saw"] and "changed no watched tensor" in v["saw"]
    lines = integrity.summary(w, stopped, rc)
    text = "\n".join(lines)
    assert "INCOMPLETE" in text and "INTACT" not in text and "None" not in text


@pytest.mark.parametrize("w,stopped,rc", [
    (watch(PAST_PROFILE + ["step 1 (first real step)"], real_steps=4), None, 0),
    (watch(PAST_PROFILE + ["step 1 (first real step)"], real_steps=2), TIMED_OUT, None),
    (watch(PAST_PROFILE), None, 0)])  # the process ended on its own: start-up finished
def test_a_finished_start_up_without_change_reads_intact(w, stopped, rc):
    assert integrity.verdict_from_watch(w, stopped, rc)["verdict"] == "intact"


def test_a_change_before_the_cut_is_still_corruption():
    v = integrity.verdict_from_watch(watch(PAST_PROFILE, CHANGE), "pass timed out after 130 s")
    assert v["verdict"] == "corrupted" and v["phase"] == "profiling run › drafter propose"


def _result(w, stopped, rc, sanitizer_verdict):
    v = integrity.verdict_from_watch(w, stopped, rc)
    info = {"outdir": "/tmp/x/pass1-none", "rc": rc, "stopped": stopped, "seconds": 40.0,
            "caching": "on", "planted": "alias_fill", "writer": None, "checks": {},
            "budget_verdict": None,
            "sanitizer": {"mode": "nvtx", "verdict": sanitizer_verdict}}
    culprit = {"verdict": v["verdict"], "hypothesis": v.get("hypothesis"),
               "phase": v.get("phase"), "tensors": v.get("tensors"), "saw": v["saw"],
               "module": v.get("module"), "op": v.get("op"), "writer": None}
    return {"passes": [{**info, "verdict": v}], "watches": [w], "culprit": culprit}


def test_printed_summary_culprit_and_probe_line_of_a_cut_pass(capsys):
    """The H200 line was: ``no writer named (…; watch: intact None)`` and ``FAILED (exit
    None)`` for a pass cut at 40 s in state creation."""
    w = watch(STARTUP)
    rep = sanitizer.tie(sanitizer.parse(CLEAN_LOG), w, TIMED_OUT, None)
    res = _result(w, TIMED_OUT, None, rep["verdict"])
    watchcmd.print_summary(res, "/tmp/x")
    line = watchcmd.probe_line("alias_fill", res["passes"], res["culprit"])
    out = capsys.readouterr().out + line
    assert "None" not in out and "intact" not in out.lower()
    assert "stopped in state creation" in line and TIMED_OUT in line
    assert "start-up incomplete" in integrity.culprit_text(res["culprit"])
    assert "start-up incomplete" in rep["verdict"]  # the sanitizer stage's own sentence


@pytest.mark.parametrize("c", [
    {"verdict": "intact", "saw": "no watched tensor changed outside its allowed writers "
                                 "(4 real steps watched)"},
    {"verdict": "corrupted", "phase": "profiling run › drafter propose", "module": None},
    {"verdict": "not watched", "saw": None}, {}])
def test_culprit_sentences_carry_no_none(c):
    assert "None" not in integrity.culprit_text(c)


def test_a_change_with_unread_pointer_and_version_says_so():
    ch = {**CHANGE, "ptr_moved": None, "version": [None, None]}
    saw = integrity.verdict_from_watch(watch(PAST_PROFILE, ch))["saw"]
    assert "None" not in saw and "storage pointer not compared" in saw
    assert "_version not readable" in saw


def test_stage_lines_without_a_recorded_verdict_carry_no_none():
    assert "None" not in " ".join(integrity.writer_lines({"mode": "nvtx"}, None))
    assert "None" not in " ".join(integrity.writer_lines({"mode": "skipped"}, None))


# ---- 2. the caching A/B only across passes that reached the change's phase ----------------------

def summary(phases, change=False, stopped=None, rc=None, writer=None):
    w = watch(phases, CHANGE if change else None)
    v = integrity.verdict_from_watch(w, stopped, rc)
    return {"passes": [{"stopped": stopped, "rc": rc, "verdict": v}],
            "culprit": {"verdict": v["verdict"], "phase": v.get("phase"), "writer": writer}}


HIT = summary(PAST_PROFILE, change=True, stopped="pass timed out after 130 s")
CUT = summary(STARTUP, stopped=TIMED_OUT)
IN_PROFILE = summary(STARTUP + ["memory profiling", "profiling run"], stopped=TIMED_OUT)
PAST = summary(PAST_PROFILE, stopped=TIMED_OUT)
DONE = summary(PAST_PROFILE + ["step 1 (first real step)"], rc=0)


@pytest.mark.parametrize("on,off,starts,must", [
    # the H200's alias_fill / triton_store: one side cut in state creation
    (CUT, HIT, "inconclusive: the caching-on pass stopped in state creation",
     ("pass timed out after 40 s", "profiling run")),
    (HIT, CUT, "inconclusive: the caching-off pass stopped in state creation",
     ("profiling run",)),
    (HIT, IN_PROFILE, "inconclusive: the caching-off pass stopped in profiling run", ()),
    (HIT, PAST, "layout-dependent", ("profiling run › drafter propose",)),
    (HIT, DONE, "layout-dependent", ()),
    (DONE, HIT, "seen only with caching off", ()),
    (HIT, HIT, "in either layout", ("tells a pointer write from an overrun",)),
    (DONE, DONE, "no symptom in either layout", ()),
    (DONE, CUT, "inconclusive: the caching-off pass stopped in state creation",
     ("end of start-up",)),
    (None, DONE, "undecided", ()),
    (summary(STARTUP, writer={"phase": "profiling run › drafter propose"}), CUT,
     "inconclusive: the caching-off pass", ()),
])
def test_caching_ab_compares_only_passes_past_the_change(on, off, starts, must):
    reading = integrity.layout_ab(on, off)["reading"]
    assert reading.startswith(starts), reading
    for m in must:
        assert m in reading, reading
    assert "None" not in reading


# ---- 4. refused NVTX permission calls: no protection, memcheck's silence says nothing ----------

def test_refused_nvtx_calls_are_read_from_the_log():
    parsed = sanitizer.parse(REFUSED_LOG)
    assert parsed["errors"] == [] and parsed["error_summary"] == 0
    assert parsed["nvtx_refused"] == [{"call": "nvtxMemPermissionsAssign", "count": 2,
                                       "reasons": ["One or more of the parameters is invalid"]}]


@pytest.mark.parametrize("log,w,applied,must,must_not", [
    (REFUSED_LOG, watch(PAST_PROFILE, CHANGE), False,
     ("not applied", "refused 2 NVTX call(s)", "says nothing about the writer"),
     ("invisible to memcheck",)),
    (CLEAN_LOG, watch(PAST_PROFILE, CHANGE, tool_attached=False), False,
     ("not applied", "no process-wide permissions handle"), ("invisible to memcheck",)),
    (CLEAN_LOG, watch(PAST_PROFILE, CHANGE, protected=False), False,
     ("not applied", "protected no tensor"), ("invisible to memcheck",)),
    (CLEAN_LOG, watch(PAST_PROFILE, CHANGE), True, ("invisible to memcheck",
                                                    "no NVTX call refused",
                                                    "no kernel it checks wrote there"),
     ("not applied", "inside a live allocation")),
    (REFUSED_LOG, watch(PAST_PROFILE + ["step 1 (first real step)"], real_steps=2), False,
     ("saw no unexpected change", "not applied"), ()),
    # plain memcheck (scripts/integrity_sanitizer.sh): no protection asked, none claimed
    (CLEAN_LOG, {**watch(PAST_PROFILE, CHANGE), "protection": {}}, False,
     ("plain memcheck", "invisible to plain memcheck"), ("not applied",)),
])
def test_memcheck_silence_means_something_only_with_the_protection_applied(
        log, w, applied, must, must_not):
    rep = sanitizer.tie(sanitizer.parse(log), w)
    assert rep["protection"]["applied"] is applied
    for m in must:
        assert m in rep["verdict"], rep["verdict"]
    for m in must_not:
        assert m not in rep["verdict"], rep["verdict"]


def test_without_watch_evidence_the_protection_is_not_claimed():
    rep = sanitizer.tie(sanitizer.parse(CLEAN_LOG), None)
    assert rep["protection"]["applied"] is False and "no watch evidence" in rep["verdict"]
    assert "None" not in rep["verdict"]


def test_the_stage_records_refused_calls_and_a_cut_pass(tmp_path):
    (tmp_path / "sanitizer.log").write_text(REFUSED_LOG)
    stage = {"mode": "nvtx", "log": str(tmp_path / "sanitizer.log")}
    got = sanistage.collect(stage, str(tmp_path), watch(STARTUP), None, TIMED_OUT)
    st = got["stage"]
    assert st["protection_applied"] is False and st["nvtx_refused"] == 2
    assert "start-up incomplete" in st["verdict"] and "stopped in state creation" in st["verdict"]
    assert "saw no unexpected change" not in st["verdict"]
    rep = json.load(open(tmp_path / "sanitizer.json"))
    assert rep["protection"]["refused_calls"][0]["call"] == "nvtxMemPermissionsAssign"


@pytest.mark.parametrize("text,want", [
    ("INFO x\n[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 320.00 MiB.\n"
     "[rank0]:[W1204 ProcessGroupNCCL.cpp:1575] Warning: destroy_process_group() was not called\n",
     "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 320.00 MiB."),
    ("Traceback (most recent call last):\nModuleNotFoundError: No module named 'cutlass'\n",
     "ModuleNotFoundError: No module named 'cutlass'"),
    ("INFO all went well\n", None),
])
def test_a_failed_pass_says_its_last_exception(tmp_path, text, want):
    """A pass that exited non-zero: the summary gives the exception line (H200, 2026-12-04:
    the 27B start-up under memcheck ended in torch.OutOfMemoryError, the summary said only
    'exit 1')."""
    from workbook.run.writer import command as watchcmd

    log = tmp_path / "pass.log"
    log.write_text(text)
    assert watchcmd.last_error(str(log)) == want
    assert watchcmd.last_error(str(tmp_path / "missing.log")) is None
