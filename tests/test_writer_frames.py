"""The named writer: its launching frame judged by module, its phase from the watch's record, one
headline per pass (issue 27, parts 1-2). Pure Python: memcheck's text as the H200 printed it
(``outputs/h200/writer-20261204``: file base names only, no folders) and watch records shaped
like the watch's own.

- the launching frame is the first one outside Triton, PyTorch, vLLM's launch plumbing and the
  workbook's hooks, judged by module: from the child's module table when the watch wrote one
  (``modules.json``), else from the library frames memcheck prints;
- a Triton kernel of a user's module called through its wrapper is named by the wrapper's frame
  in that module, not by Triton's launcher;
- the phase and step come from the watch's record (its last boundary before the pass ended at
  the refused write, or its value comparison), the stack's reading kept beside it;
- the printed pass starts with the writer, then what was and was not watched — no "INTACT" or
  "INCOMPLETE" line under a named writer.
"""

from __future__ import annotations

import os

import pytest

from conftest import evidence_json, evidence_text

from workbook.run import integrity
from workbook.run.writer import sanitizer
from workbook.run.writer import frames as writerframes

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
H200 = os.path.join(REPO, "outputs", "h200", "writer-20261204", "tiny-triton_store-caching-off",
                    "pass1-none")
LAYOUT = [{"name": "reasoning_start_token_ids", "ptr": 0x7f1659dc9800, "nbytes": 4,
           "ptr_hex": "0x7f1659dc9800", "offset": 1536}]

# a user's Triton kernel called through its wrapper, launched in the drafter of real step 3,
# as compute-sanitizer prints it (base names; the launcher frames of the H200 log above)
USER_LOG = "\n".join([
    "========= Invalid __global__ write of size 4 bytes",
    "=========     at _clear_kernel+0x90 in user_kernels.py:14",
    "=========     by thread (0,0,0) in block (0,0,0)",
    "=========     Access to 0x7f1659dc9800 is not writable",
    "=========     and is inside the nearest allocation at 0x7f1659dc9800 of size 4 bytes",
    "=========     Saved host backtrace up to driver entry point at kernel launch time",
    "=========         Host Frame: launch [0x1c81] in __triton_launcher.cpython-312-x86_64-linux"
    "-gnu.so",
    "=========         Host Frame: _start [0x257a04] in python3",
    "=========         Host Frame: __call__ in driver.py:713",
    "=========         Host Frame: run in jit.py:744",
    "=========         Host Frame: <lambda> in jit.py:370",
    "=========         Host Frame: clear_ids in user_kernels.py:19",
    "=========         Host Frame: triton_user in writers.py:110",
    "=========         Host Frame: forward in writers.py:160",
    "=========         Host Frame: __call__ in decorators.py:509",
    "=========         Host Frame: _run_model in speculator.py:424",
    "=========         Host Frame: decorate_context in _contextlib.py:124",
    "=========         Host Frame: propose in speculator.py:312",
    "=========         Host Frame: _run_in_phase in watch.py:113",
    "=========         Host Frame: wrapper in watch.py:93",
    "=========         Host Frame: execute_model in model_runner.py:1203",
    "=========         Host Frame: _run_in_phase in watch.py:113",
    "=========         Host Frame: wrapper in watch.py:93",
    "=========         Host Frame: execute_model in gpu_worker.py:700",
    "=========",
    "========= ERROR SUMMARY: 1 error", ""])


def _watch(phases, real_steps=0, position=None, change=None):
    return {"state_found": True, "startup_observed": True, "phase_order": list(phases),
            "phases": [{"phase": p} for p in phases], "layout": LAYOUT,
            "first_change": change, "changes": [change] if change else [],
            "first_real_step_phase": next((p for p in phases if p.startswith("step ")), None),
            "steps": {"real_steps": real_steps}, "vllm_version": "0.29.0",
            "device": "NVIDIA H200", "platform": "cuda", "position": position,
            "overhead": {"startup_checks": 3, "startup_check_s": 0.01, "step_checks": 0,
                         "step_check_s": 0.0},
            "protection": {"mode": "nvtx", "tool_attached": True,
                           "protected": ["reasoning_start_token_ids"]}}


STARTUP = ["runner construction", "model load", "drafter load", "state creation",
           "memory profiling", "profiling run"]
STEPS = STARTUP + ["KV-cache allocation", "warm-up", "step 1 (first real step)", "step 2",
                   "step 3"]


def test_h200_triton_log_names_the_frame_past_the_launcher():
    """The H200's own log (2026-12-04): today's reading named ``__call__ in driver.py:713``;
    by module the launcher's frames (Triton's driver and jit) are passed over."""
    parsed = sanitizer.parse(evidence_text(os.path.join(H200, "sanitizer.log")))
    w = evidence_json(os.path.join(H200, "watch", "watch.json"))
    rep = sanitizer.tie(parsed, w, None, 6)
    fw = rep["first_writer"]
    assert fw["kernel"] == "zero_store" and fw["tensor"] == "reasoning_start_token_ids"
    assert fw["frame"] == "triton_store in writers.py:89", fw
    assert fw["skipped_frames"][:3] == [
        "__call__ in driver.py:713 (triton.backends.nvidia.driver)",
        "run in jit.py:744 (triton.runtime.jit)", "<lambda> in jit.py:370 (triton.runtime.jit)"]
    # that run's watch wrote no position yet: the stack's phase, said to be the stack's
    assert fw["phase"] == "profiling run › drafter propose"
    assert fw["phase_source"].startswith("the Python stack")
    assert "driver.py" not in integrity.writer_text(fw)


def test_user_module_kernel_is_named_by_its_wrapper_through_the_module_table(tmp_path):
    """A user's kernel through its wrapper: the frame is the wrapper in the user's module.
    Two files named ``writers.py`` in the child: the one defining the function at that line
    is the frame's module."""
    user = tmp_path / "user_kernels.py"
    user.write_text("\n" * 17 + "def clear_ids(t):\n    _clear_kernel[(1,)](t)\n")
    other = tmp_path / "other" / "writers.py"
    other.parent.mkdir()
    other.write_text("def something_else():\n    pass\n")
    mine = tmp_path / "wb" / "writers.py"
    mine.parent.mkdir()
    mine.write_text("\n" * 100 + "def triton_user(t):\n" + "    pass\n" * 20)
    modules = {"user_kernels.py": [["user_kernels", str(user)]],
               "writers.py": [["other.writers", str(other)],
                              ["workbook.hooks.watch.writers", str(mine)]],
               "driver.py": [["triton.backends.nvidia.driver", "/x/triton/backends/nvidia/"
                                                               "driver.py"],
                             ["triton.runtime.driver", "/x/triton/runtime/driver.py"]]}
    rep = sanitizer.tie(sanitizer.parse(USER_LOG), _watch(STARTUP), None, 6, modules=modules)
    fw = rep["first_writer"]
    assert (fw["frame"], fw["module"], fw["module_how"]) == (
        "clear_ids in user_kernels.py:19", "user_kernels", "module table")
    # the other frames by module: the workbook writer's forward told apart from the other
    # writers.py by the function at that line
    judged = [writerframes.frame_module(f, modules) for f in
              sanitizer.parse(USER_LOG)["errors"][0]["python_frames"]]
    assert judged[0]["machinery"] and judged[0]["module"].startswith("triton")
    assert judged[4]["module"] == "workbook.hooks.watch.writers"
    # without a module table the library frames still place the launcher
    bare = sanitizer.tie(sanitizer.parse(USER_LOG), _watch(STARTUP), None, 6)["first_writer"]
    assert bare["frame"] == "clear_ids in user_kernels.py:19" and bare["module"] == "user_kernels"


def test_phase_and_step_come_from_the_watch_record():
    """A writer in real step 3 that ended the pass: the stack says only "a real step"; the
    watch's last boundary says which."""
    pos = {"boundary": "enter MTPSpeculator.propose", "seq": 88, "step": 3, "in_step": True,
           "phase": "step 3 › drafter propose"}
    w = _watch(STEPS, real_steps=3, position=pos)
    fw = sanitizer.tie(sanitizer.parse(USER_LOG), w, None, 1)["first_writer"]
    assert (fw["phase"], fw["step"]) == ("step 3 › drafter propose", 3)
    assert fw["stack_phase"] == "a real step › drafter propose"
    assert fw["phase_source"].startswith("the watch's record") and "exit 1" in \
        fw["phase_source"]
    # the pass went on after the write (exit 0): the watch's end is not the write's place
    fw0 = sanitizer.tie(sanitizer.parse(USER_LOG), w, None, 0)["first_writer"]
    assert fw0["phase"] == "a real step › drafter propose" and fw0["step"] is None
    assert "went on after the write" in fw0["phase_source"]
    # the watch's values saw that tensor change: its phase and step
    ch = {"tensor": "reasoning_start_token_ids", "phase": "step 2 › drafter propose",
          "step": 2}
    fw2 = sanitizer.tie(sanitizer.parse(USER_LOG), {**w, "first_change": ch}, None, 0)[
        "first_writer"]
    assert (fw2["phase"], fw2["step"]) == ("step 2 › drafter propose", 2)


# the same writer launched in the profiling run's drafter (the runner's _dummy_run)
PROFILE_LOG = USER_LOG.replace(
    "Host Frame: execute_model in model_runner.py:1203",
    "Host Frame: _dummy_run in model_runner.py:1203\n"
    "=========         Host Frame: profile_run in model_runner.py:1290")


def test_one_headline_writer_first_then_what_was_watched():
    pos = {"boundary": "enter MTPSpeculator.propose", "seq": 40, "step": 0, "in_step": False,
           "phase": "profiling run › drafter propose"}
    w = _watch(STARTUP, position=pos)
    fw = sanitizer.tie(sanitizer.parse(PROFILE_LOG), w, None, 6)["first_writer"]
    lines = integrity.summary(w, None, 6, fw)
    assert lines[0].startswith("WRITER: kernel _clear_kernel") and \
        "from clear_ids in user_kernels.py:19 (module user_kernels)" in lines[0]
    assert "during profiling run › drafter propose (the watch's record)" in lines[0]
    assert lines[1].startswith("WATCHED: runner construction → ") and \
        "ended at the refused write in profiling run" in lines[1], lines[1]
    assert not any(ln.startswith(("INCOMPLETE", "INTACT")) for ln in lines)
    # a writer after start-up, the pass to its end: no "INTACT ... start-up" under it
    w3 = _watch(STEPS, real_steps=3, position={**pos, "step": 3, "phase": "step 3"})
    fw3 = sanitizer.tie(sanitizer.parse(USER_LOG), w3, None, 0)["first_writer"]
    lines3 = integrity.summary(w3, None, 0, fw3)
    assert "a real step" in lines3[0] and "start-up" not in lines3[0]
    assert lines3[1].startswith("WATCHED: start-up (") and "3 real step(s)" in lines3[1]
    assert not any(ln.startswith(("INCOMPLETE", "INTACT")) for ln in lines3)
    assert "None" not in " ".join(lines + lines3)
    # without a writer the watch's own verdict line stays
    assert any(ln.startswith("INCOMPLETE") for ln in integrity.summary(w, None, 6))


# a kernel writer in real step 3 launched from the runner's execute_model before the runner's
# own code (no budget frame on its stack); the watch's last boundary was already inside the
# budget's staged writes when the fault surfaced (H100, 0.29: "step 3 › budget staged writes")
STAGED = {"boundary": "enter ThinkingBudgetState.apply_staged_writes", "seq": 120, "step": 3,
          "in_step": True, "phase": "step 3 › budget staged writes"}
EXEC_LOG = "\n".join(ln for ln in USER_LOG.splitlines()
                     if not any(x in ln for x in ("propose in", "_run_model in",
                                                  "decorators.py", "_contextlib.py")))


@pytest.mark.parametrize("log,position,change,rc,phase,step,source", [
    # the refused write ended the pass: step from the watch, sub-phase only from the stack
    (EXEC_LOG, STAGED, None, 1, "step 3 › target forward", 3, "the watch's record"),
    (USER_LOG, STAGED, None, 1, "step 3 › drafter propose", 3, "the watch's record"),
    # the watch saw the change between two boundaries inside the staged writes; the launch
    # stack shows no staged-writes frame: the window's step, the stack's sub-phase
    (EXEC_LOG, None, {"tensor": "reasoning_start_token_ids", "step": 3,
                      "phase": "step 3 › budget staged writes",
                      "last_clean": "enter ThinkingBudgetState.apply_staged_writes",
                      "first_dirty": "exit ThinkingBudgetState.apply_staged_writes"},
     0, "step 3 › target forward", 3, "the watch's value comparison"),
    # the stack says the profiling run, the watch a later step: the launch's phase
    (PROFILE_LOG, STAGED, None, 1, "profiling run › drafter propose", 0, "the Python stack"),
])
def test_the_phase_of_a_write_is_the_window_narrowed_by_the_stack(log, position, change, rc,
                                                                  phase, step, source):
    w = _watch(STEPS, real_steps=3, position=position, change=change)
    fw = sanitizer.tie(sanitizer.parse(log), w, None, rc)["first_writer"]
    assert (fw["phase"], fw["step"]) == (phase, step), fw["phase_source"]
    assert fw["phase_source"].startswith(source)
    assert "budget staged writes" not in fw["phase"]  # no such frame on any stack here
    assert "None" not in fw["phase_source"]
    if change:
        assert fw["window"] == {"from": change["last_clean"], "to": change["first_dirty"]}
        assert "between enter ThinkingBudgetState.apply_staged_writes and exit" in \
            fw["phase_source"]
    text = integrity.writer_text(fw)
    assert f"during {phase}" in text and "None" not in text


@pytest.mark.parametrize("window,stack,want", [
    ("step 3 › budget staged writes", "a real step › target forward",
     ("step 3 › target forward", "window and stack")),
    ("step 3 › budget staged writes", "between phases", ("step 3 › budget staged writes",
                                                         "window")),
    ("step 3", "a real step", ("step 3", "window and stack")),
    ("profiling run › drafter propose", "profiling run", ("profiling run", "window and stack")),
    ("step 2", "profiling run › drafter propose", ("profiling run › drafter propose", "stack")),
    # no top-phase frame on the stack (the CPU runner's execute_model): the window's top
    ("step 2 › drafter propose", "start-up › drafter propose",
     ("step 2 › drafter propose", "window and stack")),
    (None, "a real step › sampling", ("a real step › sampling", "stack"))])
def test_narrow_never_names_a_sub_phase_the_stack_does_not_show(window, stack, want):
    assert sanitizer.narrow(window, stack) == want
