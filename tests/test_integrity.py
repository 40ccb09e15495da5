"""The start-up watch, writer localization, the H-i faults and a budget that survives them.

Real vLLM (tiny CPU models, MRV2 in Triton's interpreter). Each start-up fault needs an engine
of its own, started with the fault and the watch in place (``workbook.run.backends.own_engine``):

- healthy, MTP, profiling run on, op-level localization everywhere: the phases the CPU worker
  really runs, no unexpected change, tokens identical to an unwatched engine;
- ``H-i-profile`` without MTP (writer in the target's first MLP, profiling run only): the watch
  names the profiling run's target forward, module localization names the MLP, the diagnosis
  H-i; its time limit stops the localization and the evidence keeps what it narrowed down to;
- ``H-i-profile-mtp`` (writer in the MTP drafter's MLP): the drafter propose of the profiling
  run, the drafter module, and the op (``aten.fill_`` on an alias of the marker storage);
- ``H-i-step`` (step 3, also hits the guard's replica 0): step 3's target forward; the guard,
  installed before, holds and repairs its state;
- under ``vllm serve`` (plugin): ``H-i-profile`` with MTP, named the same way.

For every fault, vLLM alone then violates the budget and the guard restores checks A and B.
Fast tests first: the guard kernel against a zeroed replica, phase naming, the layout error,
the sanitizer parser, validation.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import types

import pytest

from workbook.core.config import ConfigError, RunConfig, validate
from workbook.hooks import guard
from workbook.run import integrity, request
from workbook.run.writer import sanitizer
from workbook.vllm import env as wb_env
from workbook.vllm import startup

wb_env.prepare_process(RunConfig())  # before vLLM is imported: env and the CPU shim

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def _guard_off_after():
    yield
    guard.remove()


# ---- fast: the guard's state cannot be silently zeroed -----------------------------------------

@pytest.mark.parametrize("replicas", [(0,), (1,), (2,), (0, 1), (0, 1, 2)])
def test_guard_kernel_checks_its_replicas_against_the_host(replicas):
    import torch

    from workbook.core.budget import Markers

    from workbook.hooks.faults.budget import raw_alias_zero

    markers = Markers([1], [3], [3])
    n, tail = 4, 1
    reps = [guard.new_replica(n, tail, "cpu") for _ in range(3)]
    for rep in reps:
        b, c, t = guard.replica_views(rep, n, tail)
        b[2], c[2], t[2] = 3, 2, 0  # budget 3, two reasoning tokens so far
    for k in replicas:
        raw_alias_zero(reps[k])  # a stray writer: _version unchanged
    sampled = torch.tensor([[0, 0, 0]], dtype=torch.int64)
    num_sampled = torch.tensor([3], dtype=torch.int32)
    num_rejected = torch.tensor([0], dtype=torch.int32)
    truth = torch.tensor([[2, 3, 2, 1, 0]], dtype=torch.int32)  # the host's: slot|budget|count|
    fixed_rows = torch.zeros(1, dtype=torch.int32)               # current|tail
    counters = torch.zeros(2, dtype=torch.int32)
    log = torch.zeros((8, guard.LOG_W), dtype=torch.int32)
    echo = torch.zeros((1, guard.E_TOKENS + 3), dtype=torch.int32)
    guard.launch(sampled, num_sampled, num_rejected, truth, reps, n, tail, fixed_rows, counters,
                 log, echo, 7, markers)
    assert sampled[0, :int(num_sampled[0])].tolist() == [0, 3]  # </think> at count == budget
    assert counters.tolist() == [1, 2]  # one token replaced; budget and count repaired
    assert [r[:4] for r in log[:2].tolist()] == [[7, 0, 2, 0], [7, 0, 2, 1]]  # step|row|slot|field
    assert log[0, 4:].tolist() == [0 if k in replicas else 3 for k in range(3)] + [3, 1]
    assert log[1, 4:].tolist() == [0 if k in replicas else 2 for k in range(3)] + [2, 1]
    assert echo[0].tolist() == [2, 1, 2, 0, 0, 0, 3, -1]  # kept, replaced, repaired, taken
    # back, not taken back (reason), tokens
    views = [[v[2].tolist() for v in guard.replica_views(r, n, tail)] for r in reps]
    assert views[0] == views[1] == views[2] == [3, -1, [3]]


# ---- fast: naming, layout errors, the sanitizer report, validation -------------------------------

@pytest.mark.parametrize("stack,kw,want", [
    (["Worker.determine_available_memory", "CPUModelRunner.warming_up_model",
      "GPUModelRunner.profile_run", "GPUModelRunner._dummy_run",
      "GPUModelRunner.execute_model"], {}, "profiling run › target forward"),
    (["GPUModelRunner.profile_run", "GPUModelRunner._dummy_run", "Speculator.propose"], {},
     "profiling run › drafter propose"),
    (["GPUModelRunner._dummy_run", "GPUModelRunner.execute_model"], {"kv_ready": True},
     "warm-up › target forward"),
    (["Worker.load_model", "GPUModelRunner.load_model", "Sampler.__init__"], {},
     "state creation"),
    (["Worker.compile_or_warm_up_model", "GPUModelRunner.capture_model"], {"kv_ready": True},
     "CUDA-graph capture"),
    (["Worker.execute_model", "GPUModelRunner.execute_model"], {"step": 1},
     "step 1 (first real step) › target forward"),
    (["GPUModelRunner.sample_tokens", "ThinkingBudgetState.apply"], {"step": 4},
     "step 4 › budget apply"),
    ([], {}, "between phases"),
])
def test_phase_names(stack, kw, want):
    assert startup.classify(stack, **kw) == want


def test_a_state_without_a_watched_tensor_is_named():
    class Old:  # a vLLM whose state has no scan positions
        def __init__(self):
            self.reasoning_start_token_ids = self.reasoning_end_token_ids = None
            self.natural_reasoning_end_token_ids = self.cached_last_start = None
            self.cached_last_end = self.thinking_token_budget = None

    with pytest.raises(startup.StateLayoutError, match="cached_scan_pos"):
        startup.check_state_class(Old, "0.27.9")
    live = types.SimpleNamespace(**{k.split(".")[0]: None for k in startup.STATE_TENSORS})
    import torch

    for k in ("reasoning_start_token_ids", "reasoning_end_token_ids",
              "natural_reasoning_end_token_ids", "cached_last_start", "cached_last_end"):
        setattr(live, k, torch.zeros(1))
    live.thinking_token_budget = types.SimpleNamespace(gpu=torch.zeros(4))
    with pytest.raises(startup.StateLayoutError, match="'cached_scan_pos'"):
        startup.state_tensors(live, "0.27.9")


MEMCHECK = """========= COMPUTE-SANITIZER
========= Invalid __global__ write of size 4 bytes
=========     at void rogue_kernel<int>(int*, int)+0x1b0 in /src/rogue.cu:12
=========     by thread (3,0,0) in block (0,0,0)
=========     Address 0x7f0000000310 is out of bounds
=========     and is 12 bytes after the nearest allocation at 0x7f0000000300 of size 4 bytes
=========     Saved host backtrace up to driver entry point at kernel launch time
=========     Host Frame: cuLaunchKernel [0x2cf5b1] in libcuda.so.1
=========
========= Invalid __global__ read of size 8 bytes
=========     at other_kernel+0x20
=========     by thread (0,0,0) in block (2,0,0)
=========     Address 0x7f0000900000 is out of bounds
=========
========= ERROR SUMMARY: 2 errors
"""


def test_sanitizer_report_is_tied_to_the_watched_tensors():
    layout = [{"name": "reasoning_start_token_ids", "ptr": 0x7f0000000300, "nbytes": 4,
               "ptr_hex": "0x7f0000000300", "offset": 0},
              {"name": "cached_last_start", "ptr": 0x7f0000000400, "nbytes": 32,
               "ptr_hex": "0x7f0000000400", "offset": 256}]
    rep = sanitizer.tie(sanitizer.parse(MEMCHECK), {"layout": layout})
    assert rep["error_summary"] == 2 and rep["n_errors"] == 2 and rep["touching_watched"] == 1
    e0, e1 = rep["errors"]
    assert (e0["access"], e0["size"], e0["kernel"]) == ("write", 4, "void rogue_kernel<int>(int*, int)")
    assert e0["watched"] == {"tensor": "reasoning_start_token_ids", "relation": "past the end of",
                             "distance": 12}
    assert e1["watched"]["relation"] == "nearest watched tensor"
    assert "rogue_kernel" in rep["verdict"]
    syn = sanitizer.parse(sanitizer.synthetic({"layout": layout}))
    assert sanitizer.tie(syn, {"layout": layout})["touching_watched"] == 1


LAYOUT = [{"name": "reasoning_start_token_ids", "ptr": 0x7f94ea800200, "nbytes": 4,
           "ptr_hex": "0x7f94ea800200", "offset": 0},
          {"name": "reasoning_end_token_ids", "ptr": 0x7f94ea800400, "nbytes": 4,
           "ptr_hex": "0x7f94ea800400", "offset": 512}]


def test_nvtx_not_writable_record_names_kernel_tensor_frame_and_phase():
    """The record format of brief §9.2 (caching off, marker read-only, alias fill_)."""
    rep = sanitizer.tie(sanitizer.parse(sanitizer.synthetic_nvtx({"layout": LAYOUT})),
                        {"layout": LAYOUT})
    assert rep["n_errors"] == rep["touching_watched"] == 1 and rep["error_summary"] == 1
    w = rep["first_writer"]
    assert w["kernel"].startswith("void at::native::vectorized_elementwise_kernel<4, "
                                  "at::native::FillFunctor<int>")
    assert (w["access"], w["size"], w["permission"]) == ("write", 4, "not writable")
    assert (w["tensor"], w["relation"]) == ("reasoning_start_token_ids", "inside")
    assert w["frame"] == "raw_alias_zero in /repo/workbook/hooks/faults/budget.py:219"
    assert w["module"] == "workbook.hooks.faults.budget" and w["in_forward_of"] == "workbook.hooks.watch.writers"
    assert w["phase"] == "profiling run › drafter propose"
    assert "raw_alias_zero" in integrity.writer_text(w)


H200_RECORD = """\
========= Invalid __global__ write of size 4 bytes
=========     at void at::native::vectorized_elementwise_kernel<(int)4, at::native::FillFunctor<int>, std::array<char *, (unsigned long)1>>(int, T2, T3)+0x210
=========     by thread (0,0,0) in block (0,0,0)
=========     Access to 0x7f94ea800200 is not writable
=========     and is inside the nearest allocation at 0x7f94ea800200 of size 4 bytes
=========     Saved host backtrace up to driver entry point at kernel launch time
=========         Host Frame: cudaLaunchKernel [0x745b7] in libcudart.so.13
=========         Host Frame: _PyEval_EvalFrameDefault [0x1d710e] in python3
=========         Host Frame: raw_alias_zero in faults.py:221
=========         Host Frame: alias_fill in writers.py:34
=========         Host Frame: forward in writers.py:120
=========         Host Frame: __call__ in decorators.py:509
=========         Host Frame: _run_model in speculator.py:424
=========         Host Frame: _prefill in speculator.py:452
=========         Host Frame: propose in speculator.py:312
=========         Host Frame: _run_in_phase in watch.py:113
=========         Host Frame: wrapper in watch.py:93
=========         Host Frame: _dummy_run in model_runner.py:803
=========         Host Frame: profile_run in model_runner.py:868
=========         Host Frame: determine_available_memory in gpu_worker.py:530
=========         Host Frame: __init__ in llm.py:343
=========
========= ERROR SUMMARY: 1 error
"""


def test_memcheck_frames_by_base_name_still_name_the_phase():
    """compute-sanitizer's Python backtrace gives base names only (H200, 2026-12-04,
    outputs/h200/writer-20261204): the phase comes from those as from full paths."""
    rep = sanitizer.tie(sanitizer.parse(H200_RECORD), {"layout": LAYOUT})
    w = rep["first_writer"]
    assert (w["tensor"], w["frame"]) == ("reasoning_start_token_ids", "raw_alias_zero in faults.py:221")
    assert w["phase"] == "profiling run › drafter propose"


def test_nvtx_sub_allocator_neighbour_record_is_placed_before_the_marker():
    """Caching on, a heap registered with an unregistered neighbour (brief §9.2)."""
    log = "\n".join([
        "========= Invalid __global__ write of size 4 bytes",
        "=========     at triton_poi_fused_fill_0+0x90",
        "=========     by thread (0,0,0) in block (0,0,0)",
        "=========     Access to 0x7f94ea800000 is out of bounds and is 512 bytes before the "
        "nearest allocation at 0x7f94ea800200 of size 4 bytes",
        "=========     Saved host backtrace up to driver entry point at kernel launch time",
        "=========         Host Frame: <module> in poc.py:22",
        "========= ERROR SUMMARY: 1 error"])
    e = sanitizer.tie(sanitizer.parse(log), {"layout": LAYOUT})["errors"][0]
    assert e["permission"] == "out of bounds" and e["kernel"] == "triton_poi_fused_fill_0"
    assert e["watched"] == {"tensor": "reasoning_start_token_ids",
                            "relation": "before the start of", "distance": 512}
    assert e["writer"]["frame"] == "<module> in poc.py:22"


FAULT_DUMP = """Fatal Python error: Segmentation fault

Thread 0x00007f0000000001 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait

Current thread 0x00007f0000000002 (most recent call first):
  File "/v/site-packages/triton/runtime/interpreter.py", line 459 in create_masked_store
  File "/repo/workbook/hooks/watch/writers.py", line 78 in zero_store
  File "/repo/workbook/hooks/watch/writers.py", line 120 in forward
  File "/v/site-packages/vllm/v1/worker/gpu/spec_decode/mtp/speculator.py", line 88 in propose
  File "/v/site-packages/vllm/v1/worker/gpu/model_runner.py", line 900 in _dummy_run
  File "/v/site-packages/vllm/v1/worker/gpu/model_runner.py", line 1001 in profile_run

Extension modules: numpy.core._multiarray_umath (total: 1)
"""


def test_fault_dump_names_the_writer_frame_and_phase():
    r = sanitizer.parse_fault(FAULT_DUMP)
    assert r["signal"] == "Segmentation fault" and len(r["frames"]) == 6
    w = r["writer"]
    assert (w["function"], w["module"]) == ("zero_store", "workbook.hooks.watch.writers")
    assert w["phase"] == "profiling run › drafter propose"


_CHILD = """
import sys, types, torch
from workbook.hooks.watch import protect
from workbook.hooks.watch import writers
st = types.SimpleNamespace(**{n: torch.tensor([v], dtype=torch.int32) for n, v in
    (("reasoning_start_token_ids", 5), ("reasoning_end_token_ids", 6),
     ("natural_reasoning_end_token_ids", 7))},
    cached_last_start=torch.full((8,), -1, dtype=torch.int32),
    cached_last_end=torch.full((8,), -1, dtype=torch.int32))
g = protect.PageGuard(st, sys.argv[1]); g.attach()
assert st.reasoning_start_token_ids.tolist() == [5]       # reads are free
g.lift(); st.cached_last_start.fill_(3); g.restore()         # a legitimate writer, lifted
assert st.cached_last_start.tolist()[:1] == [3]
print("protected", flush=True)
writers.WRITE[sys.argv[2]](st.reasoning_start_token_ids)
print("NOT REFUSED", flush=True)
"""


@pytest.mark.parametrize("kind,function", [("alias_fill", "raw_alias_zero"),
                                           ("memset", "memset"),
                                           ("triton_store", "zero_store")])
def test_page_twin_names_the_writer_of_a_protected_marker(tmp_path, kind, function):
    """The CPU twin's contract, per writer kind: the write is refused (SIGSEGV), the child
    ends there, and its fault dump names the writer's frame."""
    env = {**os.environ, "PYTHONPATH": REPO, "TRITON_INTERPRET": "1"}
    p = subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path), kind], env=env,
                       capture_output=True, text=True, timeout=300)
    assert "protected" in p.stdout and "NOT REFUSED" not in p.stdout, p.stdout + p.stderr
    assert p.returncode == 11, p.stderr[-2000:]  # _exit(SIGSEGV) after the dump
    w = sanitizer.parse_fault(open(tmp_path / "fault.txt").read())["writer"]
    assert w["function"] == function and w["module"] in ("workbook.hooks.watch.writers",
                                                          "workbook.hooks.faults.budget")


def test_sanitizer_requirements_name_what_is_missing(monkeypatch):
    from workbook.hooks.watch import protect

    monkeypatch.setenv("CXX", "/nonexistent/g++")
    monkeypatch.setenv("COMPUTE_SANITIZER", "/nonexistent/compute-sanitizer")
    monkeypatch.setenv("CUDA_HOME", "/nonexistent")
    monkeypatch.setenv("NVTX_INCLUDE", "/nonexistent")
    monkeypatch.setattr(protect, "_cuda_roots", lambda: [])
    monkeypatch.setattr(protect, "_include_dirs", lambda: [])
    req = protect.requirements("nvtx")
    assert not req["ok"]
    assert req["missing"] == ["compute-sanitizer", "NVTX headers", "CUDA runtime headers",
                              "C++ compiler"]
    assert "sanitizer stage skipped" in req["message"] and "CXX" in req["message"]
    with pytest.raises(protect.ProtectError, match="NVTX headers"):
        protect.build_shim()
    assert protect.requirements("page")["ok"]
    assert protect.resolve_mode("auto", "cpu") == "page"
    assert protect.resolve_mode("auto", "cuda") == "nvtx"


def test_nvtx_shim_compiles(tmp_path):
    """The shim against real NVTX headers (the CUDA toolkit's, or ``NVTX_INCLUDE``: nvidia-nvtx)
    with stand-in CUDA headers; outside compute-sanitizer it reports no tool attached."""
    from workbook.hooks.watch import protect

    inc = protect.find_nvtx_include()
    if inc is None or protect.find_compiler() is None:
        pytest.skip("no NVTX headers (set NVTX_INCLUDE) or no C++ compiler")
    stub = tmp_path / "cuda"
    stub.mkdir()
    (stub / "cuda.h").write_text("typedef struct CUarray_st* CUarray;\n"
                                 "typedef struct CUmipmappedArray_st* CUmipmappedArray;\n")
    (stub / "cuda_runtime.h").write_text(
        "typedef struct cudaArray* cudaArray_t;\n"
        "typedef struct cudaMipmappedArray* cudaMipmappedArray_t;\n"
        "typedef struct CUstream_st* cudaStream_t;\n")
    os.environ.setdefault("CUDA_HOME", str(tmp_path))  # cuda_runtime.h found under include/
    (tmp_path / "include").symlink_to(stub)
    try:
        lib = protect.load_shim(protect.build_shim(str(tmp_path / "cache")))
    finally:
        if os.environ.get("CUDA_HOME") == str(tmp_path):
            del os.environ["CUDA_HOME"]
    assert lib.wbp_init() == 2  # no tool attached: every permission call is a no-op
    assert [lib.wbp_flag(i) for i in range(3)] == [1, 7, 8]
    # one permissions call per region (a NULL pointer skipped): the number of calls made
    assert lib.wbp_assign(protect._arr([0x1000, 0, 0x2000]), 3, 1) == 2


@pytest.mark.parametrize("mode", ["nvtx", "page"])
def test_sanitizer_stage_collects_the_writer_into_the_pass(tmp_path, mode):
    """``sanistage.collect``: the log / fault dump of a pass → writer.json, the verdict's
    integrity section (H-i, corrupted, the writer) and what the summary carries."""
    from workbook.core import rundir
    from workbook.run.writer import stage as sanistage

    watch_ev = {"layout": LAYOUT, "phase_order": ["state creation", "profiling run"],
                "protection": {"protected": ["reasoning_start_token_ids"]}}
    rundir.write_json(str(tmp_path / "verdict.json"),
                      {"integrity": {"verdict": "intact", "hypothesis": None}})
    if mode == "nvtx":
        stage = {"mode": "nvtx", "log": str(tmp_path / "sanitizer.log")}
        (tmp_path / "sanitizer.log").write_text(sanitizer.synthetic_nvtx(watch_ev))
    else:
        (tmp_path / "watch").mkdir()
        (tmp_path / "watch" / "fault.txt").write_text(FAULT_DUMP)
        stage = {"mode": "page", "fault_file": str(tmp_path / "watch" / "fault.txt")}
    got = sanistage.collect(stage, str(tmp_path), watch_ev, 11 if mode == "page" else 1)
    w = got["writer"]
    assert w["phase"] == "profiling run › drafter propose"
    assert w["function"] == ("raw_alias_zero" if mode == "nvtx" else "zero_store")
    assert w["watch_last_phase"] == "profiling run"
    on_disk = json.load(open(tmp_path / "writer.json"))
    assert on_disk["writer"]["frame"] == w["frame"]
    v = json.load(open(tmp_path / "verdict.json"))["integrity"]
    assert (v["verdict"], v["hypothesis"]) == ("corrupted", "H-i") and v["writer"]["frame"]
    lines = integrity.writer_lines(got["stage"], w)
    assert lines[1].startswith("FIRST WRITER:") and "None" not in " ".join(lines)


@pytest.mark.parametrize("asked,platform,want", [
    ("auto", "cuda", ["nvtx", "api"]),  # memcheck sees kernels, CUPTI the API: never together
    ("auto", "cpu", ["page"]),          # a read-only page faults on every store
    ("nvtx", "cuda", ["nvtx"]), ("api", "cuda", ["api"]), ("page", "cpu", ["page"]),
    ("none", "cuda", [])])
def test_the_sanitize_plan_per_platform(asked, platform, want):
    from workbook.run.writer import stage as sanistage

    assert sanistage.modes(asked, platform) == want
    for m in want:  # every form says what it sees and what it cannot
        assert sanistage.SEES[m] and sanistage.BLIND[m]
    assert "CUDA API" in sanistage.BLIND["nvtx"] and "kernel" in sanistage.BLIND["api"]


_KERNEL = {"kernel": "_clear_kernel", "tensor": "reasoning_start_token_ids", "step": 0}


@pytest.mark.parametrize("info,verdict,ran,why", [
    # the memcheck pass named a kernel writer: the context died there, the API pass runs
    ({"sanitizer": {"mode": "nvtx"}, "writer": _KERNEL},
     {"verdict": "corrupted", "tensors": ["reasoning_start_token_ids"]}, True, "CUDA context"),
    # the watch saw a change memcheck has no record of (H100 memset / copy runs)
    ({"sanitizer": {"mode": "nvtx"}, "writer": None},
     {"verdict": "corrupted", "tensors": ["reasoning_start_token_ids"],
      "phase": "profiling run › drafter propose"}, True, "no memcheck record"),
    # cut before the real steps: not everything was watched
    ({"sanitizer": {"mode": "nvtx"}, "writer": None},
     {"verdict": "incomplete", "saw": "start-up incomplete: the pass stopped in warm-up"},
     True, "did not watch the whole start-up"),
    # no compute-sanitizer: the API pass still has its own tools to try
    ({"sanitizer": {"mode": "skipped", "message": "missing compute-sanitizer"}, "writer": None},
     {"verdict": "intact"}, True, "skipped"),
    # intact into the real steps, nothing named: a copy or memset would have changed a value
    ({"sanitizer": {"mode": "nvtx"}, "writer": None},
     {"verdict": "intact", "saw": "no watched tensor changed (5 real steps watched)"},
     False, "not needed")])
def test_the_api_pass_runs_unless_the_memcheck_pass_settled_it(info, verdict, ran, why):
    from workbook.run.writer import stage as sanistage

    need, text = sanistage.api_pass(info, verdict)
    assert need is ran and why in text and "None" not in text


def test_the_first_named_writer_heads_the_summary():
    from workbook.run.writer import command as watchcmd

    kern = {"kernel": "k", "step": 3}
    api = {"call": "cudaMemsetAsync", "step": 0}
    assert watchcmd.first_named([(0, kern), (1, api)]) is api  # an earlier step wins
    assert watchcmd.first_named([(0, {**kern, "step": 0}), (1, api)])["kernel"] == "k"
    assert watchcmd.first_named([(0, {**kern, "step": None}), (1, api)]) is not api
    assert watchcmd.first_named([]) is None


def test_a_localization_past_its_time_limit_keeps_what_it_narrowed(tmp_path):
    from workbook.hooks import watch

    w = watch.Watch(watch.Options(out_dir=str(tmp_path), localize="op", localize_timeout_s=0.0))
    w.loc.on_first_change({"tensor": "reasoning_start_token_ids", "phase": "profiling run",
                           "module": "target.model.layers.7.mlp", "op": None,
                           "last_clean": "mod-enter target.model.layers.7.mlp",
                           "first_dirty": "mod-exit target.model.layers.7.mlp",
                           "level": "module"})
    w.history.append("mod-exit target.model.layers.9")
    import time

    time.sleep(0.01)
    assert w.loc.timed_out() and w.loc.timed_out()  # stops once, stays stopped
    data = json.load(open(tmp_path / "watch.json"))  # written when it stopped
    loc = data["localization"]
    assert loc["stopped"].startswith("time limit of 0 s") and not loc["complete"]
    assert loc["culprit"]["module"] == "target.model.layers.7.mlp"


def test_validation_of_watch_parameters():
    with pytest.raises(ConfigError, match="enforce_eager"):
        validate(RunConfig(localize="op", enforce_eager=False), on_cpu=True)
    with pytest.raises(ConfigError, match="localize="):
        validate(RunConfig(localize="ops"), on_cpu=True)
    with pytest.raises(ConfigError, match="cpu_profile_run"):
        validate(RunConfig(fault="H-i-profile"), on_cpu=True)  # vLLM 0.32 skips it on CPU
    with pytest.raises(ConfigError, match="MTP drafter"):
        validate(RunConfig(fault="H-i-profile-mtp", spec_method="none", cpu_profile_run=True),
                 on_cpu=True)
    with pytest.raises(ConfigError, match="GPU worker"):
        validate(RunConfig(cpu_profile_run=True), on_cpu=False)
    assert RunConfig(localize="module").watched


# ---- the real engine --------------------------------------------------------------------------

def _run(cfg: RunConfig, outdir):
    from workbook.run import pipeline

    res = pipeline.run(cfg, str(outdir))
    assert res.watch is not None and res.watch["startup_observed"]
    on_disk = json.load(open(os.path.join(outdir, "watch.json")))
    assert on_disk["first_change"] == res.watch["first_change"]
    progressive = glob.glob(os.path.join(outdir, "server_trace", "*", "watch.json")) \
        if cfg.mode == "server" else [os.path.join(outdir, "watch", "watch.json")]
    assert progressive and os.path.exists(progressive[0])  # written as the start-up went
    return res


def _guard_holds(eng, check_b: bool = True) -> None:
    """vLLM alone violates the budget; with the guard checks A (and B) are exact."""
    off = request.check_a(eng)
    assert not request.check_ok("A", off), [o.token_ids for o in off]
    with guard.enabled():
        a = request.check_a(eng)
        assert request.check_ok("A", a), [o.token_ids for o in a]
        if check_b:
            b = request.check_b(eng, budgets=(2, 6), max_tokens=12)
            assert request.check_ok("B", b), [o.token_ids for o in b]


def test_watch_healthy_changes_nothing(engines, tmp_path):
    cfg = RunConfig(watch=True, localize="op", cpu_profile_run=True, max_tokens=12)
    res = _run(cfg, tmp_path)
    w = res.watch
    assert w["state_found"] and w["first_change"] is None and w["n_changes"] == 0
    order = w["phase_order"]
    for p in ("runner construction", "model load", "drafter load", "state creation",
              "profiling run", "KV-cache allocation", "step 1 (first real step)"):
        assert p in order, order
    assert order.index("state creation") < order.index("profiling run") < \
        order.index("KV-cache allocation") < order.index("step 1 (first real step)")
    assert {"reasoning_start_token_ids", "cached_scan_pos", "thinking_token_budget.gpu",
            "canary.pre0", "canary.post1"} <= {t["name"] for t in w["tensors"]}
    assert w["state_at_end"]["markers_intact"] and w["state_at_end"]["canaries_intact"]
    assert w["expected_changes"] > 0  # the caches moved, inside their writers only
    assert w["steps"]["mode"] == "ring"  # every step after the detailed ones, cheaply
    assert res.verdict["integrity"]["verdict"] == "intact"
    # tokens identical to an unwatched engine (no profiling run, no watch)
    budgets = [None, 1, 3, 6]
    watched = request.run_budgets(res.engine, budgets, max_tokens=12)
    plain = request.run_budgets(engines(), budgets, max_tokens=12)
    assert [o.token_ids for o in watched] == [o.token_ids for o in plain]
    assert [o.token_ids for o in res.outcomes] == \
        [o.token_ids for o in request.run_reported(engines(), max_tokens=12)]


def test_profile_fault_without_mtp(tmp_path):
    cfg = RunConfig(spec_method="none", fault="H-i-profile", cpu_profile_run=True,
                    localize="module", max_tokens=12)
    res = _run(cfg, tmp_path)
    v = res.verdict["integrity"]
    assert v["hypothesis"] == "H-i" and v["verdict"] == "corrupted"
    assert v["phase"] == "profiling run › target forward"
    assert v["module"] == "target.model.layers.0.mlp"
    assert set(v["tensors"]) >= {"reasoning_start_token_ids", "reasoning_end_token_ids",
                                 "natural_reasoning_end_token_ids"}
    ch = res.watch["first_change"]
    assert ch["ptr_moved"] is False and ch["version"][0] == ch["version"][1]
    assert ch["after"] == [0] and ch["before"] != [0]
    loc = res.watch["localization"]
    assert loc["complete"] and loc["culprit"]["module"] == "target.model.layers.0.mlp"
    assert res.outcome.honored is False  # vLLM alone: the budget is ignored
    _guard_holds(res.engine, check_b=False)


def test_profile_fault_in_the_mtp_drafter_named_to_the_op(tmp_path):
    cfg = RunConfig(fault="H-i-profile-mtp", cpu_profile_run=True, localize="op",
                    max_tokens=12)
    res = _run(cfg, tmp_path)
    v = res.verdict["integrity"]
    assert v["hypothesis"] == "H-i"
    assert v["phase"] == "profiling run › drafter propose"
    assert v["module"].startswith("drafter.") and v["module"].endswith("mlp")
    assert v["op"] == "aten.fill_.Scalar"
    assert v["alias_write"]["alias"] is True  # a raw alias of the marker storage
    assert res.watch["localization"]["complete"]
    _guard_holds(res.engine)


def test_step_fault_and_the_guard_holds(tmp_path):
    cfg = RunConfig(fault="H-i-step", guard=True, localize="module",
                    thinking_token_budget=6, max_tokens=12)
    res = _run(cfg, tmp_path)
    v = res.verdict["integrity"]
    assert v["hypothesis"] == "H-i" and v["step"] == 3
    assert v["phase"] == "step 3 › target forward"
    assert v["module"] == "target.model.layers.0.mlp"
    assert "profiling run" not in res.watch["phase_order"]  # CPU default: none ran
    assert res.outcome.honored is True, res.outcome.token_ids  # the guard held ...
    st = guard.state(res.engine.runner)
    assert st.check_repairs() >= 1  # ... and repaired its zeroed replica
    guard.remove()
    bad = request.run_budgets(res.engine, [3], max_tokens=8)[0]
    assert bad.honored is False  # vLLM alone, after the writer struck


def test_watch_under_vllm_serve(tmp_path):
    cfg = RunConfig(mode="server", fault="H-i-profile", cpu_profile_run=True,
                    localize="module", max_tokens=6)
    res = _run(cfg, tmp_path)
    v = res.verdict["integrity"]
    assert v["hypothesis"] == "H-i"
    assert v["phase"] == "profiling run › target forward"
    assert v["module"] == "target.model.layers.0.mlp"
    assert res.watch["speculator_class"].endswith("MTPSpeculator")
    assert res.outcome.honored is False


def test_sanitizer_dry_run(tmp_path):
    """The GPU stage's script on a CPU: the watched run, a synthetic memcheck log, the tie."""
    out = tmp_path / "san"
    env = {**os.environ, "DRY_RUN": "1", "PYTHON": sys.executable}
    p = subprocess.run(["bash", os.path.join(REPO, "scripts", "integrity_sanitizer.sh"),
                        str(out), "--set", "max_tokens=2", "--set", "spec_method=none"],
                       env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    rep = json.load(open(out / "sanitizer.json"))
    assert rep["touching_watched"] == 1
    assert rep["errors"][0]["watched"]["tensor"] == "reasoning_start_token_ids"


# ---- the sanitizer stage on the real engine (issue #19; CPU twin) -------------------------------

@pytest.mark.parametrize("kind,function,module,phase", [
    ("alias_fill", "raw_alias_zero", "workbook.hooks.faults.budget", "profiling run › drafter propose"),
    ("memset@2", "memset", "workbook.hooks.watch.writers", "step 2 › drafter propose"),
    ("triton_user", "_clear_kernel", "tests.data.user_kernels",
     "profiling run › drafter propose")])
def test_sanitize_names_the_writer_hidden_in_the_drafter(tmp_path, kind, function, module,
                                                         phase):
    """A writer of each kind hidden in the MTP drafter's propose during the profiling run (or,
    ``@2``, in real step 2): the sanitized pass (markers on read-only pages, a child process)
    ends at the write and the watch summary names the writer's frame and module (a user's
    Triton kernel by its own module, not Triton's) and the phase and step from the watch's
    own record. Asked as a user types it, a bare ``--sanitize`` (auto): on a CPU its plan is
    the one page pass, which says what it sees and what it cannot."""
    from workbook.run.writer import command as watchcmd

    cfg = RunConfig(cpu_profile_run=True, sanitize="auto", watch=True, max_tokens=8)
    res = watchcmd.run_passes(cfg, str(tmp_path), "none", timeout_s=1200, writer=kind)
    assert res["sanitize_plan"] == {"asked": "auto", "platform": "cpu", "forms": ["page"]}
    assert len(res["passes"]) == 1
    p = res["passes"][0]
    assert p["sanitizer"]["mode"] == "page" and p["rc"] == 11, p
    assert "libc memset" in p["sanitizer"]["sees"] and "UVA" in p["sanitizer"]["cannot_see"]
    w = p["writer"]
    assert (w["function"], w["module"]) == (function, module), w
    assert w["phase"] == phase, (w["phase_source"], w["stack"])
    assert w["phase_source"].startswith("the watch's record")
    assert w["step"] == (2 if "@" in kind else 0)
    assert w["in_forward_of"] == "workbook.hooks.watch.writers"  # the drafter forward it hid in
    summary = json.load(open(tmp_path / "watch-summary.json"))
    assert summary["culprit"]["writer"]["function"] == function
    watch_ev = res["watches"][0]
    assert watch_ev["protection"]["mode"] == "page"
    assert {"reasoning_start_token_ids", "cached_last_start"} <= \
        set(watch_ev["protection"]["protected"])
    assert watch_ev["layout_evidence"]["at_state_creation"]["platform"] == "cpu"
    assert "state creation" in watch_ev["phase_order"]


def test_sanitize_without_its_tools_is_skipped_and_the_watch_runs(tmp_path):
    """nvtx asked on this CPU host (no compute-sanitizer, no NVTX headers): the stage is
    skipped with a message naming them; the watched pass itself runs to the end."""
    from workbook.run.writer import command as watchcmd

    cfg = RunConfig(sanitize="nvtx", watch=True, spec_method="none", max_tokens=2)
    res = watchcmd.run_passes(cfg, str(tmp_path), "none", timeout_s=1200)
    p = res["passes"][0]
    assert p["rc"] == 0 and p["sanitizer"]["mode"] == "skipped" and p["writer"] is None
    assert "compute-sanitizer" in p["sanitizer"]["message"]
    w = res["watches"][0]
    assert w["protection"]["mode"] == "skipped" and "compute-sanitizer" in \
        w["protection"]["message"]
    assert w["state_found"] and w["first_change"] is None
    assert p["verdict"]["verdict"] == "intact"
    # the pipeline's own reading (the watch alone, no pass info): the start-up finished
    # because the watch saw the real steps begin, so intact — not "incomplete"
    assert w["steps"]["real_steps"] >= 1
    own = json.load(open(os.path.join(p["outdir"], "verdict.json")))["integrity"]
    assert own["verdict"] == "intact", own


def test_sampler_warmup_runs_the_budget_writers_in_the_profiling_run(tmp_path):
    """PR #57926's window on today's vLLM: the dummy sampler gets registered sampling
    parameters, so the budget state's staged writes run inside the profiling run."""
    from workbook.hooks.watch import window

    before = window.RECORD["calls"]
    res = _run(RunConfig(cpu_profile_run=True, sampler_warmup=True, watch=True, max_tokens=4),
               tmp_path)
    assert window.RECORD["calls"] == before + 1 and window.RECORD["rows"] >= 1
    assert window.RECORD["dropped"] == ["top_k", "top_p"]  # CPU: the interpreter's limit
    phases = {e["phase"] for e in res.watch["timeline"]}
    assert "profiling run › budget staged writes" in phases, sorted(phases)
    assert res.watch["first_change"] is None  # a legitimate writer, bracketed
