"""The sanitizer stage of ``workbook watch --sanitize``: run a pass so a write names its writer.

For one watched pass (``workbook.run.writer.command.run_pass``), in order:

1. ``plan(cfg, outdir)``   the form (``workbook.hooks.watch.protect``): ``nvtx`` on a GPU, ``page``
   (the CPU twin) on CPU; for ``nvtx`` what the host lacks — compute-sanitizer, NVTX headers,
   CUDA runtime headers, a C++ compiler — is named and the stage is ``skipped`` (the pass runs
   as a plain watched pass: the rest of the watch is intact);
2. ``wrap(stage, cmd, env)``  ``nvtx``: the pass's command under ``compute-sanitizer --tool
   memcheck`` (log ``outdir/sanitizer.log``); ``page``: unchanged (the child's watch moves the
   markers onto read-only pages and arms ``faulthandler``);
3. ``collect(stage, outdir, watch, rc)``  ``nvtx``: memcheck's log parsed and tied to the
   watched addresses of that very run (``workbook.run.writer.sanitizer``; ``outdir/sanitizer.json``);
   ``page``: the fault dump (``outdir/watch/fault.txt``) parsed; either way the first writer:
   kernel (GPU), access, tensor, Python frame and module, phase — ``outdir/writer.json`` and
   the ``integrity`` section of ``outdir/verdict.json`` (when the pass got that far).

One run names the first writer only: on a GPU the CUDA context is dead after the reported
write; on CPU the process ends at the fault (no core file). Not here: the protection itself
(``workbook.hooks.watch.protect``), the parsers (``workbook.run.writer.sanitizer``).

The plan of a bare ``--sanitize`` (``auto``, what a user types): ``modes(asked, platform)``. No
single form sees every writer on a GPU — memcheck holds kernels to the NVTX permissions but not
the CUDA API's copies and memsets, and CUPTI (which names those at the call) cannot subscribe
beside compute-sanitizer — so ``auto`` on a GPU is two start-ups: ``nvtx`` (memcheck, CUPTI off),
then ``api`` (CUPTI, no sanitizer) unless the first settles it (``api_pass``: its start-up ran
to its real steps with nothing changed and nothing named). On a CPU one ``page`` pass sees every
store (PyTorch ops, Triton's interpreter, libc ``memset``/``memcpy``). ``SEES`` / ``BLIND`` say,
per form, what a pass could and could not see; every pass prints both.
"""

from __future__ import annotations

import os
import sys

from workbook.core import rundir

LOG = "sanitizer.log"

# what each form of the stage sees, and what it cannot (one place: the pass lines, the summary)
SEES = {
    "nvtx": "kernel writes of any library (PyTorch, Triton, FlashInfer, cuBLAS, ...) into the "
            "read-only markers, their red zones and the canaries, named by kernel and launch stack",
    "api": "copies and memsets through the CUDA API (cudaMemcpy*, cudaMemset*, cuMemcpy*, "
           "cuMemsetD*) into watched memory, named at the call with its Python stack",
    "page": "every store into the protected markers and marker caches (PyTorch ops, Triton's "
            "interpreter, libc memset / memcpy), named by the faulting Python stack",
}
BLIND = {
    "nvtx": "copies and memsets through the CUDA API (memcheck does not hold them to NVTX "
            "permissions; CUPTI cannot subscribe beside compute-sanitizer); only the first "
            "writer (the CUDA context dies at it)",
    "api": "kernel writes (no read-only permission without compute-sanitizer: the watch sees "
           "their change between two boundaries, unnamed)",
    "page": "the budget's UVA view (not protected; the watch compares its values); only the "
            "first writer (the process ends at it)",
}


def modes(asked: str, platform: str) -> list[str]:
    """The forms a ``--sanitize`` asks for, in pass order: ``auto`` on a GPU ``["nvtx",
    "api"]`` (the second only if ``api_pass`` says so), on a CPU ``["page"]``; an explicit form
    alone; ``none``: none."""
    if asked == "none":
        return []
    if asked == "auto":
        return ["nvtx", "api"] if platform == "cuda" else ["page"]
    return [asked]


def api_pass(first: dict, verdict: dict) -> tuple[bool, str]:
    """Whether the auto plan's ``api`` pass must run after the ``nvtx`` pass ``first`` (its
    ``run_pass`` info) whose watch reads ``verdict`` (``integrity.verdict_from_watch``), and
    why — a sentence. It is left out only where the first pass settled everything: its start-up
    reached the real steps with no watched tensor changed and no writer named (a copy or memset
    into watched memory would have changed a value the watch compares)."""
    stage = first.get("sanitizer") or {}
    writer = first.get("writer")
    v = verdict.get("verdict")
    if stage.get("mode") == "skipped":
        return True, (f"the memcheck pass was skipped ({stage.get('message') or 'no reason'}); "
                      "the API pass still names copies and memsets")
    if writer:
        return True, ("the memcheck pass named the first kernel writer and the CUDA context "
                      "died there: what ran after it, and any copy or memset through the CUDA "
                      "API, is the API pass's")
    if v == "corrupted":
        return True, (f"the watch saw {', '.join(verdict.get('tensors') or []) or 'a watched tensor'}"
                      f" change during {verdict.get('phase') or 'the start-up'} with no memcheck "
                      "record: memcheck does not check copies and memsets through the CUDA API, "
                      "the API pass names those at the call")
    if v == "intact":
        return False, ("not needed: the memcheck pass watched the start-up into its real steps "
                       "with no watched tensor changed and no writer named")
    return True, (f"the memcheck pass did not watch the whole start-up ({verdict.get('saw') or v}); "
                  "the API pass watches it again")


def plan(cfg, outdir: str) -> dict:
    """The stage for ``cfg`` (``{"mode": "none" | "nvtx" | "page" | "skipped", ...}``)."""
    from workbook.hooks.watch import protect
    from workbook.vllm import env as wb_env

    if getattr(cfg, "sanitize", "none") == "none":
        return {"mode": "none"}
    platform = "cpu" if wb_env.on_cpu() else "cuda"
    mode = protect.resolve_mode(cfg.sanitize, platform)
    if mode == "api" and platform != "cuda":
        msg = ("writes through the CUDA API: not available on this platform "
               f"({platform}: no CUDA API to subscribe to); stage skipped")
        print(f"workbook watch: {msg}", file=sys.stderr, flush=True)
        return {"mode": "skipped", "asked": cfg.sanitize, "platform": platform,
                "missing": ["a CUDA device"], "message": msg}
    if mode == "page" and platform != "cpu":
        return {"mode": "skipped", "asked": cfg.sanitize, "platform": platform,
                "missing": ["a CPU platform"], "message": "sanitize='page' is the CPU twin: "
                "on a GPU use 'nvtx' (stage skipped)"}
    req = protect.requirements(mode)
    if not req["ok"]:
        print(f"workbook watch: {req['message']}", file=sys.stderr, flush=True)
        return {"mode": "skipped", "asked": cfg.sanitize, "platform": platform,
                "missing": req["missing"], "message": req["message"]}
    st = {"mode": mode, "asked": cfg.sanitize, "platform": platform, "missing": [],
          "sees": SEES.get(mode), "cannot_see": BLIND.get(mode)}
    if mode == "nvtx":
        try:  # before any engine starts: a shim that does not build is named here
            st["shim"] = protect.build_shim()
        except protect.ProtectError as e:
            print(f"workbook watch: sanitizer stage skipped: {e}", file=sys.stderr, flush=True)
            return {"mode": "skipped", "asked": cfg.sanitize, "platform": platform,
                    "missing": ["a shim that builds"], "message": f"sanitizer stage skipped: {e}"}
        st.update(sanitizer=req["found"]["compute-sanitizer"], log=os.path.join(outdir, LOG))
    if mode in ("nvtx", "api"):
        st["api_file"] = os.path.join(outdir, "watch", "api_writes.json")
    if mode == "api":
        try:  # before any engine starts: a subscriber that does not build is named here
            from workbook.hooks.watch import apiwrites

            st["cupti_shim"] = apiwrites.build()
        except Exception as e:
            msg = f"sanitizer stage skipped: {e}"
            print(f"workbook watch: {msg}", file=sys.stderr, flush=True)
            return {"mode": "skipped", "asked": cfg.sanitize, "platform": platform,
                    "missing": ["a CUPTI subscriber that builds"], "message": msg}
    elif mode != "nvtx":
        st["fault_file"] = os.path.join(outdir, "watch", protect.FAULT_FILE)
    return st


def _modules(outdir: str) -> dict | None:
    """The child's module table (``modules.json``, written by the watch beside ``watch.json``)."""
    from workbook.run.writer import sanitizer

    for d in (outdir, os.path.join(outdir, "watch")):
        m = sanitizer.read_modules(os.path.join(d, "watch.json"))
        if m is not None:
            return m
    return None


def _api_stage(doc: dict | None, watch: dict | None, api: dict | None) -> dict:
    """The CUPTI watcher's part of the stage record: on or why not, calls seen, hits."""
    st = (((watch or {}).get("protection") or {}).get("api_writes")) or {}
    if doc is None and not st.get("on"):
        return {"api_writes": st["message"]} if st.get("message") else {}
    n = len((doc or {}).get("records") or [])
    # one counter read at two moments: api_writes.json at its last hit (or at subscription),
    # the watch's record at the end of the pass; the later reading is the larger
    seen = [c for c in ((doc or {}).get("calls_seen"), st.get("calls_seen")) if c is not None]
    calls = max(seen) if seen else None
    return {"api_writes": (f"{n} write(s) through the CUDA API into watched memory"
                           if n else "no write through the CUDA API into watched memory")
            + (f" ({calls} memcpy/memset calls checked)" if calls is not None else ""),
            "api_hits": n}


def wrap(stage: dict, cmd: list[str], env: dict) -> tuple[list[str], dict]:
    if stage["mode"] != "nvtx":
        return cmd, env
    env = {**env, "WORKBOOK_UNDER_SANITIZER": "1"}  # no CUPTI in the child (protect.attach)
    return [stage["sanitizer"], "--tool", "memcheck", "--target-processes", "all",
            "--print-limit", "1000", "--log-file", stage["log"], *cmd], env


def collect(stage: dict, outdir: str, watch: dict | None, rc, stopped: str | None = None) -> dict:
    """The writer the stage named (or None) and the stage's record; writes ``writer.json``.
    ``stopped``: why the pass was cut (its time limit), so that the verdict never reads a
    start-up that did not finish as watched to its end."""
    from workbook.run import integrity
    from workbook.run.writer import sanitizer

    mode = stage["mode"]
    writer = None
    if mode == "nvtx":
        if os.path.exists(stage["log"]):
            with open(stage["log"], errors="replace") as f:
                rep = sanitizer.tie(sanitizer.parse(f.read()), watch, stopped, rc,
                                    modules=_modules(outdir))
            rundir.write_json(os.path.join(outdir, "sanitizer.json"), rep)
            stage = {**stage, "n_errors": rep["n_errors"],
                     "touching_watched": rep["touching_watched"], "verdict": rep["verdict"],
                     "protection_applied": rep["protection"]["applied"],
                     "nvtx_refused": rep["protection"]["refused"]}
            writer = rep.get("first_writer")
        else:
            stage = {**stage, "verdict": "compute-sanitizer wrote no log (see pass.log)"}
    elif mode == "api":
        stage = {**stage, "verdict": "no read-only permission (CUPTI only): copies and memsets "
                 "through the CUDA API are named at the call; kernels' writes are the watch's"}
    if mode == "page":
        path = stage["fault_file"]
        text = open(path, errors="replace").read() if os.path.exists(path) else ""
        fault = sanitizer.parse_fault(text)
        protected = ((watch or {}).get("protection") or {}).get("protected") or []
        if fault["writer"]:
            w = fault["writer"]
            writer = {"source": "CPU twin: write to a read-only page (SIGSEGV)",
                      "kernel": None, "access": "write", "size": None, "address": None,
                      "permission": "not writable",
                      "tensor": None, "protected": protected,
                      "frame": w["frame"], "function": w["function"], "module": w["module"],
                      "module_how": w["module_how"], "skipped_frames": w["skipped_frames"],
                      "in_forward_of": w["in_forward_of"], "phase": w["phase"],
                      "stack": w["stack"][:12]}
            writer = sanitizer.with_watch_phase(writer, watch, rc, stopped)
        stage = {**stage, "signal": fault["signal"], "exit": rc,
                 "verdict": (f"a write to a protected tensor raised "
                             f"{fault['signal'] or 'a fault'}; the process ended there"
                             if fault["writer"] else
                             "no write to a protected tensor (no fault)")}
    if mode in ("nvtx", "api"):
        doc = rundir.read_json(stage.get("api_file") or os.path.join(outdir, "watch", "api_writes.json"))
        api = sanitizer.api_writer(doc, watch, _modules(outdir))
        stage = {**stage, **_api_stage(doc, watch, api)}
        if writer is None and api is not None:
            writer = api
            if stage.get("verdict") and mode == "nvtx":
                stage["verdict"] = ("a write through the CUDA API named at the call (CUPTI); "
                                    "memcheck: " + stage["verdict"])
    if writer is not None and watch:
        writer["watch_last_phase"] = (watch.get("phase_order") or [None])[-1]
    if mode != "none":
        rundir.write_json(os.path.join(outdir, "writer.json"), {"stage": stage,
                                                                "writer": writer})
        vpath = os.path.join(outdir, "verdict.json")
        v = rundir.read_json(vpath)
        if v is not None and writer is not None:
            v["integrity"] = integrity.with_writer(v.get("integrity") or {}, writer)
            rundir.write_json(vpath, v)
    return {"stage": stage, "writer": writer}
