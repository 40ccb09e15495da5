"""``workbook watch``: one start-up under the watch, narrowed down to the writer, in one command.

    workbook watch [--env ENV [--run NAME]] [--set KEY=VALUE ...] [--localize auto|none|module|op]
                   [--within MODULE] [--timeout S] [--out DIR]

``run_passes(cfg, out, localize)`` does the work (the CLI only builds ``cfg``):

- ``localize="auto"`` (the default): pass 1 watches a start-up with module-level localization;
  if it names a module, pass 2 watches a *fresh* start-up with op-level localization inside that
  module only (``localize_within``) — a bisection across start-ups, since the phase that
  changed the state runs once per start-up. Each pass is its own process (``python -m
  workbook.run.writer.command --pass``), so on a GPU the first engine's memory is gone before the
  second starts.
- ``none`` / ``module`` / ``op``: one pass at that level.

Each pass is a full pipeline run (``workbook.run.pipeline.run``) with ``watch=True`` into
``out/pass<N>-<level>/`` (``watch.json``, ``verdict.json`` with its ``integrity`` section, the
trace, ...); ``out/watch-summary.json`` combines them: the phases that ran, the first phase that
changed a watched tensor with the values before and after, the tensors that moved, the module
and the op (or kernel launch). A pass that hits its time limit (``localize_timeout_s``) or the
process timeout still leaves what it narrowed down to (``watch/watch.json`` is written as the
start-up goes).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

from workbook.core import rundir
from workbook.run import request
from workbook.core.config import RunConfig
from workbook.core.envfiles import REPO



def from_environment(name: str, run: str | None,
                     overrides: dict) -> tuple[RunConfig, list[str]]:
    """A ``RunConfig`` and the ``checks`` from ``environments/<name>.yaml`` (or a path): its
    ``defaults``, then the entry of ``run`` (default: the run named ``integrity``, if any),
    then ``overrides``; the checks are the run's own, else the file's, as the batch uses.
    Keys that are not ``RunConfig`` fields (notebook-only parameters) are ignored."""
    import yaml

    from workbook.core.config import ConfigError

    path = name if os.path.isfile(name) else next(
        (p for p in (os.path.join(root, "environments", f"{name}.yaml")
                     for root in (os.getcwd(), REPO)) if os.path.isfile(p)), None)
    if path is None:
        known = sorted({f[:-5] for root in (os.getcwd(), REPO)
                        if os.path.isdir(os.path.join(root, "environments"))
                        for f in os.listdir(os.path.join(root, "environments"))
                        if f.endswith(".yaml")})
        raise ConfigError(f"environment {name!r} not found (environments/{name}.yaml); "
                          f"environments: {', '.join(known) or 'none found'}")
    with open(path) as f:
        raw = yaml.safe_load(f) or {}
    runs = {r.get("name"): r for r in raw.get("runs") or []}
    if run is None and "integrity" in runs:
        run = "integrity"
    if run is not None and run not in runs:
        raise ConfigError(f"{path}: no run {run!r} (runs: {sorted(runs)})")
    entry = runs.get(run) or {}
    params = {**(raw.get("defaults") or {}), **entry, **overrides}
    return RunConfig.from_params(params), list(entry.get("checks", raw.get("checks")) or [])


def _pass_dir(out: str, n: int, level: str) -> str:
    return os.path.join(out, f"pass{n}-{level}")


def run_pass(cfg: RunConfig, outdir: str, timeout_s: float | None = None,
             checks=(), caching: str | None = None, writer: str | None = None,
             plan: str | None = None) -> dict:
    """One watched start-up in a child process; returns its ``watch.json`` (or what the
    start-up wrote before it died / timed out). With ``cfg.sanitize`` the child runs under
    the sanitizer stage (``workbook.run.writer.stage``) and the writer it names is in
    ``info["writer"]``; ``caching`` ("on" / "off") sets PyTorch's caching allocator for the
    child; ``writer`` hides a test writer in the drafter (``workbook.hooks.watch.writers``)."""
    from workbook.run import server
    from workbook.run.writer import stage as sanistage

    os.makedirs(outdir, exist_ok=True)
    rundir.write_json(os.path.join(outdir, "pass-config.json"),
                      {**cfg.to_dict(), "_checks": list(checks), "_writer": writer})
    cmd = [sys.executable, "-m", "workbook.run.writer.command", "--pass", outdir]
    env = dict(os.environ)
    if caching is not None:
        env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1" if caching == "off" else "0"
    stage = sanistage.plan(cfg, outdir)
    if plan:
        stage["plan"] = plan  # a pass of the auto plan (its hints name the plan's other pass)
    cmd, env = sanistage.wrap(stage, cmd, env)
    t0 = time.perf_counter()
    rc, why = None, None
    with open(os.path.join(outdir, "pass.log"), "wb") as log:
        # its own session: on a time limit or an interrupt the whole group goes (under
        # compute-sanitizer the engine is a grandchild that must not outlive the pass)
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True, preexec_fn=server.die_with_parent)
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            why = f"pass timed out after {timeout_s:.0f} s"
            _end_group(proc)
        except BaseException:
            _end_group(proc)
            raise
    watch = rundir.read_json(os.path.join(outdir, "watch.json")) or \
        rundir.read_json(os.path.join(outdir, "watch", "watch.json"))
    info = {"outdir": outdir, "rc": rc, "stopped": why,
            "seconds": round(time.perf_counter() - t0, 1),
            "caching": caching or ("off" if env.get("PYTORCH_NO_CUDA_MEMORY_CACHING") == "1"
                                   else "on")}
    named = sanistage.collect(stage, outdir, watch, rc, why)
    info["sanitizer"], info["writer"] = named["stage"], named["writer"]
    if writer:
        info["planted"] = writer
    verdict = rundir.read_json(os.path.join(outdir, "verdict.json")) or {}
    checks_done = rundir.read_json(os.path.join(outdir, "checks.json")) or {}
    info["budget_verdict"] = verdict.get("verdict")
    info["checks"] = {name: request.check_ok(name, outs) for name, outs in checks_done.items()}
    if watch is None:
        info["error"] = "no watch evidence (see pass.log)"
    return {"info": info, "watch": watch}


def _end_group(proc, grace_s: float = 10.0) -> None:
    """SIGTERM to the pass's process group, SIGKILL after ``grace_s``."""
    import signal

    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_passes(cfg: RunConfig, out: str, localize: str = "auto",
               timeout_s: float | None = None, checks=(), caching: str | None = None,
               writer: str | None = None) -> dict:
    """The watch command's work; returns (and writes) ``watch-summary.json``. ``checks``
    (A, B) run in the first pass, after the reported request. A bare ``--sanitize``
    (``cfg.sanitize == "auto"``) runs the stage's plan (``workbook.run.writer.stage.modes``):
    the localization passes in its first form, then on a GPU the ``api`` pass where
    ``stage.api_pass`` says the first did not settle it."""
    from workbook.run import integrity
    from workbook.run.writer import stage as sanistage
    from workbook.vllm import env as wb_env

    base = cfg.replace(watch=True)
    platform = "cpu" if wb_env.on_cpu() else "cuda"
    forms = sanistage.modes(base.sanitize, platform)
    auto = base.sanitize == "auto"
    plan = "auto" if auto else None
    first_cfg = base.replace(sanitize=forms[0]) if forms else base
    passes = []
    if localize == "auto":
        first = run_pass(first_cfg.replace(localize="module", localize_within=""),
                         _pass_dir(out, 1, "module"), timeout_s, checks, caching, writer, plan)
        passes.append(first)
        v = integrity.verdict_from_watch(first["watch"], first["info"]["stopped"],
                                         first["info"]["rc"])
        module = v.get("module")
        if v.get("verdict") == "corrupted" and module and not v.get("op") and \
                not first["info"].get("writer"):
            passes.append(run_pass(first_cfg.replace(localize="op", localize_within=module),
                                   _pass_dir(out, 2, "op"), timeout_s, caching=caching,
                                   writer=writer, plan=plan))
    else:
        passes.append(run_pass(first_cfg.replace(localize=localize,
                                                 localize_within=base.localize_within
                                                 if localize == "op" else ""),
                               _pass_dir(out, 1, localize), timeout_s, checks, caching, writer,
                               plan))
    verdicts = [integrity.verdict_from_watch(p["watch"], p["info"].get("stopped"),
                                             p["info"].get("rc")) for p in passes]
    plan_rec = None
    if auto:
        plan_rec = {"asked": "auto", "platform": platform, "forms": forms}
        if len(forms) > 1:
            need, why = sanistage.api_pass(passes[0]["info"], verdicts[0])
            plan_rec["api_pass"] = {"ran": need, "why": why}
            if need:
                p = run_pass(base.replace(sanitize="api", localize="none", localize_within=""),
                             os.path.join(out, f"pass{len(passes) + 1}-api"), timeout_s,
                             caching=caching, writer=writer, plan=plan)
                passes.append(p)
                verdicts.append(integrity.verdict_from_watch(p["watch"], p["info"].get("stopped"),
                                                             p["info"].get("rc")))
    verdicts = [integrity.with_writer(v, p["info"].get("writer"))
                for p, v in zip(passes, verdicts)]
    best = next((v for v in reversed(verdicts) if v.get("verdict") == "corrupted"),
                verdicts[-1] if verdicts else {})
    first_v = next((v for v in verdicts if v.get("verdict") == "corrupted"), best)
    named = [(i, p["info"]["writer"]) for i, p in enumerate(passes) if p["info"].get("writer")]
    summary = {"config": base.to_dict(), "localize": localize, "sanitize_plan": plan_rec,
               "passes": [{**p["info"], "verdict": v} for p, v in zip(passes, verdicts)],
               "culprit": {"hypothesis": best.get("hypothesis"), "verdict": best.get("verdict"),
                           "phase": first_v.get("phase"), "tensors": first_v.get("tensors"),
                           "before": first_v.get("before"), "after": first_v.get("after"),
                           "module": best.get("module") or first_v.get("module"),
                           "op": best.get("op"), "kernel": best.get("kernel"),
                           "saw": best.get("saw"),
                           "writer": first_named(named),
                           "writers": [{"pass": i + 1, **w} for i, w in named]}}
    os.makedirs(out, exist_ok=True)
    rundir.write_json(os.path.join(out, "watch-summary.json"), summary)
    return {**summary, "watches": [p["watch"] for p in passes]}


def first_named(named: list[tuple[int, dict]]) -> dict | None:
    """Of the writers the passes named (``(pass index, writer)``), the one to head the summary:
    the one in the earliest real step (``step``; 0 is start-up) where every one has a step —
    each pass is a fresh start-up of the same configuration, but passes watch at different
    boundaries, so inside one step their order is not known and the earlier pass's is kept."""
    if not named:
        return None
    steps = [w.get("step") for _, w in named]
    if all(s is not None for s in steps):
        return named[steps.index(min(steps))][1]
    return named[0][1]


_EXC = re.compile(r"^(?:\[rank\d+\]:\s*)?((?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception|Interrupt))"
                  r"(?::\s*(.*))?$")


def last_error(path: str, width: int = 160) -> str | None:
    """The last Python exception line of a pass's log (``torch.OutOfMemoryError: CUDA out of
    memory. Tried to allocate …``), shortened to ``width`` characters; None when there is none
    or no log."""
    try:
        with open(path, errors="replace") as f:
            lines = f.read().splitlines()[-400:]
    except OSError:
        return None
    for ln in reversed(lines):
        m = _EXC.match(ln.strip())
        if m:
            text = m.group(1) + (f": {m.group(2)}" if m.group(2) else "")
            return text if len(text) <= width else text[:width - 1] + "…"
    return None


def print_summary(result: dict, out: str) -> None:
    from workbook.run import integrity

    for i, (p, w) in enumerate(zip(result["passes"], result["watches"]), 1):
        code = p.get("rc")
        if code == 0:
            failed = ""
        elif code is None:  # cut (time limit, interrupt): no exit status of its own
            failed = ", ended by the workbook: see pass.log" if p.get("stopped") else \
                ", no exit status recorded: see pass.log"
        elif p.get("writer"):
            failed = f", ended at the refused write (exit {code})"
        else:
            err = last_error(os.path.join(p["outdir"], "pass.log"))
            failed = f", FAILED (exit {code}{': ' + err if err else ''}): see pass.log"
        stopped = ", " + p["stopped"] if p.get("stopped") else ""
        print(f"== pass {i}: {p['outdir']} ({p['seconds']} s{stopped}{failed})")
        san = p.get("sanitizer") or {}
        if san.get("sees"):
            print(f"this pass ({san['mode']}) sees {san['sees']}; it cannot see "
                  f"{san.get('cannot_see') or 'nothing recorded'}")
        for line in integrity.summary(w, p.get("stopped"), code, p.get("writer")):
            print(line)
        if p.get("checks") or p.get("budget_verdict"):
            checks = p.get("checks") or {}
            ran = ", ".join(f"{k} {'exact' if ok else 'FAILED'}" for k, ok in checks.items())
            print(f"budget: {p.get('budget_verdict') or 'no verdict recorded'}; checks: "
                  f"{ran or 'none ran'}")
        if p.get("sanitizer", {}).get("mode", "none") != "none":
            for line in integrity.writer_lines(p["sanitizer"], p.get("writer")):
                print(line)
    plan = result.get("sanitize_plan")
    if plan and plan.get("api_pass"):
        ap = plan["api_pass"]
        print(f"sanitize plan ({' then '.join(plan['forms'])}): API pass "
              f"{'ran' if ap['ran'] else 'left out'}: {ap['why']}")
    c = result["culprit"]
    print("== culprit")
    if c.get("verdict") == "corrupted" and c.get("tensors"):
        print(f"hypothesis {c['hypothesis']}: phase {c['phase']}; module {c.get('module') or '-'};"
              f" op {c.get('op') or '-'}; tensors {c.get('tensors')}; "
              f"{c.get('before')} → {c.get('after')}")
    if c.get("writer"):
        print(f"hypothesis {c.get('hypothesis') or 'H-i'}: writer "
              f"{integrity.writer_text(c['writer'])}")
        for w in c.get("writers") or []:
            if w.get("source") != c["writer"].get("source") or w.get("call") != \
                    c["writer"].get("call") or w.get("kernel") != c["writer"].get("kernel"):
                print(f"also named (pass {w['pass']}): {integrity.writer_text(w)}")
    elif c.get("verdict") != "corrupted" or not c.get("tensors"):
        print(integrity.culprit_text(c))
    print(os.path.join(out, "watch-summary.json"))


def _child(outdir: str) -> int:
    """``--pass OUTDIR``: one pipeline run of ``OUTDIR/pass-config.json`` (in this process)."""
    from workbook.run import pipeline

    raw = rundir.read_json(os.path.join(outdir, "pass-config.json"))
    checks = raw.pop("_checks", [])
    writer = raw.pop("_writer", None)
    cfg = RunConfig.from_dict(raw)
    if writer:
        from workbook.hooks.watch import writers
        from workbook.vllm import env as wb_env

        wb_env.prepare_process(cfg)  # before vLLM is imported
        writers.hide(*writers.parse_spec(writer))
    pipeline.run(cfg, outdir, checks=checks)
    return 0


def probe_line(kind: str, passes: list[dict], culprit: dict) -> str:
    """The one ``PROBE …`` line of ``--probe``: what the sanitizer stage named (and in which
    pass of the plan), else why not in each pass, and the watch's reading as a sentence."""
    from workbook.run import integrity

    p0 = passes[0] if passes else {}
    forms = "+".join((p.get("sanitizer") or {}).get("mode") or "none" for p in passes) or "none"
    head = f"PROBE {kind} caching={p0.get('caching') or 'unset'} sanitizer={forms}"
    w = culprit.get("writer")
    if w:
        n = next((i for i, p in enumerate(passes, 1) if p.get("writer") is w
                  or p.get("writer") == w), None)
        return f"{head}: named {integrity.writer_text(w)}" + (
            f" (pass {n} of {len(passes)})" if n and len(passes) > 1 else "")
    whys = []
    for i, p in enumerate(passes, 1):
        san = p.get("sanitizer") or {}
        why = san.get("verdict") or san.get("message") or "the stage recorded no verdict"
        whys.append(f"pass {i} ({san.get('mode') or 'none'}): {why}" if len(passes) > 1 else why)
    return (f"{head}: no writer named ({'; '.join(whys)}; "
            f"watch: {integrity.culprit_text(culprit)})")


def _probe(a) -> int:
    """``--probe KIND``: one sanitized pass with a test writer of ``KIND`` hidden in the
    drafter's propose during the profiling run (``workbook.hooks.watch.writers``); prints the
    summary and one line ``PROBE kind caching: named …`` (scripts/writer_gpu.sh, the tests)."""
    overrides = {}
    for kv in a.set or []:
        import yaml

        k, _, v = kv.partition("=")
        overrides[k] = yaml.safe_load(v)
    if a.env:
        cfg, _ = from_environment(a.env, a.run, overrides)
    else:
        cfg = RunConfig.from_params(overrides)
    cfg = cfg.replace(watch=True, sanitize=a.sanitize, localize="none")
    spec = a.probe + (f"@{a.writer_step}" if a.writer_step else "")
    res = run_passes(cfg, a.out, "none", timeout_s=a.timeout, caching=a.caching,
                     writer=spec)
    print_summary(res, a.out)
    print(probe_line(spec, res["passes"], res["culprit"]))
    return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--pass", dest="pass_dir")
    ap.add_argument("--probe", choices=["alias_fill", "copy", "memset", "triton_store", "triton_user",
                                        "overrun"])
    ap.add_argument("--writer-step", type=int, metavar="N",
                    help="--probe: write in real step N instead of the profiling run")
    ap.add_argument("--env")
    ap.add_argument("--run")
    ap.add_argument("--set", action="append", metavar="KEY=VALUE")
    ap.add_argument("--sanitize", default="auto", choices=["auto", "nvtx", "page", "api", "none"])
    ap.add_argument("--caching", choices=["on", "off"])
    ap.add_argument("--timeout", type=float)
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.writer_step is not None and (not args.probe or args.writer_step < 1):
        ap.error("--writer-step N: a real step number (1, 2, ...) with --probe KIND")
    if args.probe:
        if not args.out:
            ap.error("--probe needs --out")
        sys.exit(_probe(args))
    if not args.pass_dir:
        ap.error("--pass OUTDIR or --probe KIND")
    sys.exit(_child(args.pass_dir))
