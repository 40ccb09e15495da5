"""compute-sanitizer memcheck reports, parsed and tied to the watched addresses.

The second stage of the writer search on a GPU host (``scripts/integrity_sanitizer.sh``): the
same watched start-up runs under ``compute-sanitizer --tool memcheck`` with
``PYTORCH_NO_CUDA_MEMORY_CACHING=1`` (every tensor its own ``cudaMalloc``, so an access past a
tensor's end leaves the allocation and memcheck sees it). ``parse(text)`` reads memcheck's log
into records (kind, access, size, kernel, address, nearest allocation, block/thread, host
frames); ``tie(records, watch)`` places each address relative to the watch's ``layout`` (the
device addresses of the budget state's tensors and canaries in that very run): *inside* a
watched tensor, *just past* one (the nearest allocation memcheck names is a watched tensor), or
the nearest watched tensor and the distance.

Plain memcheck only reports accesses outside every live allocation: a writer that lands inside
one (the marker tensor itself, as on the reporter's Thor) is invisible to it — that case is the
watch's (value comparison at every boundary), and ``tie`` says so when the watch saw a change
that no memcheck record explains. With the markers read-only through NVTX, memcheck reports a
kernel's write inside them ("is not writable"); a write through the CUDA API (``cudaMemsetAsync``
on the marker: not reported on the H200, 2026-12-04, ``outputs/h200/writer-20261204``) stays
invisible, and ``tie`` says that no checked kernel wrote there, not where it was written.

The writer's frame is the first launching frame outside Triton, PyTorch, vLLM's launch plumbing
and the workbook's hooks, judged by module (``workbook.run.writer.frames``: memcheck prints base
names only, so the child's module table ``modules.json`` places them); its phase and step come
from the watch's own record (``phase_from_watch``), the stack's reading kept as ``stack_phase``.

    python -m workbook.run.writer.sanitizer LOG --watch WATCH_JSON [-o OUT_JSON]
    python -m workbook.run.writer.sanitizer --synthetic WATCH_JSON   # a sample log (CPU dry run)
"""

from __future__ import annotations

import argparse
import json
import re
import sys

from workbook.run.writer.frames import name_writer

_HDR = re.compile(r"^=+\s+(?P<kind>Invalid __(?P<space>global|shared|local)__ (?P<access>read|write)"
                  r"|Out-of-range Shared or Local Address|Misaligned .*?|Cuda API error.*?|"
                  r"Program hit .*?|Malloc/Free error.*?|Invalid .*?)"
                  r"(?: of size (?P<size>\d+) bytes?)?\s*$")
_AT = re.compile(r"^=+\s+at (?P<kernel>.+?)(?:\+0x[0-9a-fA-F]+)?(?: in (?P<src>.+))?$")
_THREAD = re.compile(r"^=+\s+by thread \((?P<thread>[^)]*)\) in block \((?P<block>[^)]*)\)")
_ADDR = re.compile(r"(?:Address|Access to|Access at) (?P<addr>0x[0-9a-fA-F]+)")
# NVTX memory permissions (brief §9.2): "Access to 0x… is not writable and is inside the nearest
# allocation at 0x… of size 4 bytes"; "… is out of bounds and is 512 bytes before …"
_PERM = re.compile(r"is (?P<perm>not writable|not readable|not accessible|out of bounds)")
_INSIDE = re.compile(r"inside the nearest allocation at (?P<base>0x[0-9a-fA-F]+) of size "
                     r"(?P<size>[\d,]+) bytes")
_NEAR = re.compile(r"(?P<dist>[\d,]+) bytes (?P<dir>before|after) the nearest allocation at "
                   r"(?P<base>0x[0-9a-fA-F]+) of size (?P<size>[\d,]+) bytes")
_FRAME = re.compile(r"^=+\s+Host Frame:\s*(?P<frame>.+)$")
# a Python frame in the host backtrace: "<module> in poc.py:22", "forward in /x/y.py:12"
_PYFRAME = re.compile(r"^(?P<func>\S.*?) in (?P<file>[^\s\[\]]+\.py):(?P<line>\d+)\s*$")
_SUMMARY = re.compile(r"ERROR SUMMARY:\s*(?P<n>\d+) error")
# the tool refusing an NVTX call (the permission it carried was never applied):
# "========= Warning: Call to nvtxMemPermissionsAssign failed: One or more of the parameters is
# invalid"
# memcheck stopped a faulting kernel: the launch failed after the records it printed
_LAUNCH_FAILED = re.compile(r"^=+\s+Program hit \S*(?:LAUNCH_FAILED|LaunchFailure)|"
                            r"unspecified launch failure")
_REFUSED = re.compile(r"^=+\s+Warning: Call to (?P<call>nvtx\w+) failed:\s*(?P<why>.*?)\s*$")


def parse(text: str) -> dict:
    """memcheck's log → ``{"errors": [...], "error_summary": n | None, "lines": n,
    "nvtx_refused": [{"call", "count", "reasons"}, ...]}`` (the NVTX calls the tool refused)."""
    errors: list[dict] = []
    cur: dict | None = None
    summary = None
    refused: dict[str, dict] = {}
    launch_failed = False
    for raw in text.splitlines():
        line = raw.rstrip()
        m = _REFUSED.match(line)
        if m:
            r = refused.setdefault(m.group("call"), {"call": m.group("call"), "count": 0,
                                                      "reasons": []})
            r["count"] += 1
            if m.group("why") and m.group("why") not in r["reasons"]:
                r["reasons"].append(m.group("why"))
            cur = None
            continue
        m = _SUMMARY.search(line)
        if m:
            summary = int(m.group("n"))
            continue
        if _LAUNCH_FAILED.search(line):
            launch_failed = True
            cur = None
            continue
        m = _HDR.match(line)
        if m and not line.strip("= ").startswith(("at ", "by ", "Address", "Host Frame",
                                                   "Saved host", "and is")):
            cur = {"kind": m.group("kind").strip(), "access": m.group("access"),
                   "space": m.group("space"),
                   "size": int(m.group("size")) if m.group("size") else None,
                   "kernel": None, "source": None, "thread": None, "block": None,
                   "address": None, "nearest": None, "permission": None,
                   "host_frames": [], "python_frames": []}
            errors.append(cur)
            continue
        if cur is None:
            continue
        m = _AT.match(line)
        if m and cur["kernel"] is None:
            cur["kernel"], cur["source"] = m.group("kernel").strip(), m.group("src")
            continue
        m = _THREAD.match(line)
        if m:
            cur["thread"], cur["block"] = m.group("thread"), m.group("block")
            continue
        m = _ADDR.search(line)
        if m and cur["address"] is None:
            cur["address"] = int(m.group("addr"), 16)
        m = _PERM.search(line)
        if m and cur["permission"] is None:
            cur["permission"] = m.group("perm")
        m = _INSIDE.search(line)
        if m:
            cur["nearest"] = {"base": int(m.group("base"), 16),
                              "size": int(m.group("size").replace(",", "")),
                              "distance": 0, "direction": "inside"}
            continue
        m = _NEAR.search(line)
        if m:
            cur["nearest"] = {"base": int(m.group("base"), 16),
                              "size": int(m.group("size").replace(",", "")),
                              "distance": int(m.group("dist").replace(",", "")),
                              "direction": m.group("dir")}
            continue
        m = _FRAME.match(line)
        if m:
            frame = m.group("frame").strip()
            py = _PYFRAME.match(frame)
            if py:
                cur["python_frames"].append({"func": py.group("func"), "file": py.group("file"),
                                             "line": int(py.group("line"))})
            elif len(cur["host_frames"]) < 24:
                cur["host_frames"].append(frame)
    return {"errors": errors, "error_summary": summary, "lines": len(text.splitlines()),
            "nvtx_refused": list(refused.values()), "launch_failed": launch_failed}


_FAULT_HDR = re.compile(r"^(?:Current thread|Thread) 0x[0-9a-fA-F]+ .*most recent call first")
_FAULT_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')


def parse_fault(text: str) -> dict:
    """A ``faulthandler`` dump (the CPU twin: a write to a read-only page raised SIGSEGV) →
    ``{"signal": ..., "frames": [...] (innermost first), "writer": name_writer(frames)}``."""
    sig, frames, cur = None, [], False
    for line in text.splitlines():
        if line.startswith("Fatal Python error:"):
            sig = line.split(":", 1)[1].strip()
        if _FAULT_HDR.match(line):
            cur = line.startswith("Current thread") or not frames
            if cur:
                frames = []
            continue
        m = _FAULT_FRAME.match(line)
        if m and cur:
            frames.append({"file": m.group("file"), "line": int(m.group("line")),
                           "func": m.group("func")})
        elif cur and frames and not line.strip():
            cur = False
    return {"signal": sig, "frames": frames, "writer": name_writer(frames)}


def protection_status(parsed: dict, watch: dict | None) -> dict:
    """Was the read-only protection in force under memcheck? ``attempted``: the watch asked
    for NVTX permissions (``protection.mode == "nvtx"``) or the log shows NVTX calls; a run
    without (plain memcheck, ``scripts/integrity_sanitizer.sh``) attempted none. Applied only
    when attempted, the watch lists protected tensors, the shim found a tool attached, and the
    tool refused none of the NVTX calls in its log; otherwise ``why`` says what was missing."""
    prot = (watch or {}).get("protection") or {}
    refused = parsed.get("nvtx_refused") or []
    n = sum(r["count"] for r in refused)
    attempted = prot.get("mode") == "nvtx" or bool(n)
    why = []
    if n:
        calls = "; ".join(f"{r['call']} ×{r['count']}" + (f" ({', '.join(r['reasons'])})"
                                                          if r["reasons"] else "")
                          for r in refused)
        why.append(f"compute-sanitizer refused {n} NVTX call(s): {calls}")
    if watch is None:
        why.append("no watch evidence, so no record that any tensor was protected")
    elif not attempted:
        why.append("no read-only protection was asked for (plain memcheck)")
    elif not prot.get("protected"):
        why.append("the watch protected no tensor" + (f" ({prot['message']})"
                                                      if prot.get("message") else ""))
    if prot.get("tool_attached") is False:
        why.append("the shim got no process-wide permissions handle (wbp_init reported no "
                   "NVTX tool), so its permission calls carried none")
    return {"attempted": attempted, "applied": not why, "refused": n, "refused_calls": refused,
            "why": "; ".join(why) if why else None}


def tie(parsed: dict, watch: dict | None, stopped: str | None = None, rc=None,
        modules: dict | None = None) -> dict:
    """Each error placed relative to the watched tensors of the same run; the verdict says
    whether memcheck's silence means anything (the protection applied, the start-up
    watched to its end). ``stopped`` / ``rc``: how the pass ended (``workbook.run.writer.command``);
    ``modules``: the child's module table (``writerframes.frame_module``)."""
    from workbook.run import integrity

    layout = (watch or {}).get("layout") or []
    out = []
    for e in parsed["errors"]:
        t = dict(e)
        t["address_hex"] = hex(e["address"]) if e.get("address") is not None else None
        t["watched"] = _place(e, layout)
        out.append(t)
    hits = [e for e in out if e["watched"] and e["watched"]["relation"] in (
        "inside", "past the end of", "before the start of", "in the red zone below",
        "in the red zone above")]
    for e in out:
        e["writer"] = name_writer(e.get("python_frames") or [], modules)
    change = (watch or {}).get("first_change")
    prot = protection_status(parsed, watch)
    not_applied = (f"the read-only protection was not applied ({prot['why']}), so memcheck's "
                   "silence says nothing about the writer")
    from workbook.run.writer import overrun

    ext = overrun.first_extent(parsed, layout, (watch or {}).get("layout_evidence")) \
        if hits else None
    if hits:
        what = (ext["sentence"] if ext is not None and ext["kind"] != "outside" else
                f"{hits[0]['watched']['relation']} {hits[0]['watched']['tensor']}")
        verdict = (f"{len(hits)} memcheck error(s) touch watched memory or its red zones; "
                   f"first: {hits[0]['kind']} by kernel {hits[0]['kernel'] or '(not named)'} "
                   f"{what}")
        if not prot["applied"] and prot["attempted"]:
            verdict += f"; note: {prot['why']}"
    elif change and prot["applied"]:
        verdict = ("the watch saw " + change["tensor"] + " change during " + change["phase"] +
                   " but no memcheck error touches watched memory, with the protection applied "
                   "(no NVTX call refused): memcheck holds kernels' accesses to the permissions, "
                   "so no kernel it checks wrote there while the protection held; the write "
                   "came another way (invisible to memcheck: e.g. a memset or copy through the "
                   "CUDA API, which memcheck does not hold to NVTX permissions); the watch's "
                   "localization names the phase")
    elif change and watch is not None and not prot["attempted"]:
        verdict = ("the watch saw " + change["tensor"] + " change during " + change["phase"] +
                   " but no memcheck error touches watched memory: plain memcheck (no read-only "
                   "protection) sees only accesses outside live allocations, so the write stayed "
                   "inside one (invisible to plain memcheck); the watch's localization names it")
    elif change:
        verdict = ("the watch saw " + change["tensor"] + " change during " + change["phase"] +
                   " and no memcheck error touches watched memory, but " + not_applied +
                   "; the watch's localization names the phase")
    else:
        reach = integrity.startup_reach(watch, stopped, rc)
        verdict = f"{len(out)} memcheck error(s), none in watched memory; "
        verdict += ("the watch saw no unexpected change" if reach["complete"] else
                    integrity.incomplete_text(reach))
        if not prot["applied"] and (prot["attempted"] or watch is None):
            verdict += "; " + not_applied
    return {"errors": out, "error_summary": parsed.get("error_summary"),
            "n_errors": len(out), "touching_watched": len(hits), "verdict": verdict,
            "protection": prot,
            "first_writer": with_watch_phase(with_extent(first_writer(hits[0]), ext), watch,
                                             rc, stopped) if hits else None,
            "extent": ext,
            "watched_layout": layout}


def first_writer(e: dict) -> dict:
    """One tied memcheck record as the writer the watch summary names."""
    w = e.get("writer") or {}
    return {"source": "compute-sanitizer memcheck", "kernel": e.get("kernel"),
            "access": e.get("access"), "size": e.get("size"), "address": e.get("address_hex"),
            "permission": e.get("permission"),
            "tensor": (e.get("watched") or {}).get("tensor"),
            "relation": (e.get("watched") or {}).get("relation"),
            "frame": w.get("frame"), "function": w.get("function"), "module": w.get("module"),
            "module_how": w.get("module_how"), "skipped_frames": w.get("skipped_frames", []),
            "in_forward_of": w.get("in_forward_of"), "phase": w.get("phase"),
            "stack": w.get("stack", [])[:12]}


def with_extent(w: dict, ext: dict | None) -> dict:
    """The writer with its whole access range (``workbook.run.writer.overrun.extent``): an overrun or a
    write into a red zone is said as a range ("write runs 4 bytes into X from below, starting
    …"), not as one access's size and relation; a write inside a tensor keeps them and gains
    the bytes it covered."""
    if ext is None or ext["kind"] == "outside":
        return w
    out = {**w, "extent": ext, "tensor": ext["tensor"]}
    if ext["kind"] == "inside":
        out["range"] = ext["sentence"].split(": ", 1)[1]
    else:
        out.update(size=None, relation=None,
                   range=f"{w.get('access') or 'write'} {ext['sentence']}")
    return out


def _split_phase(phase: str | None) -> tuple[str | None, str | None]:
    if not phase:
        return None, None
    top, _, sub = phase.partition(" › ")
    return top, sub or None


def narrow(window_phase: str | None, stack_phase: str | None) -> tuple[str | None, str]:
    """The phase of a write from the watch's window and the launch's stack: the window's top
    phase (it carries the step number), the sub-phase only where the stack shows its frame —
    never a boundary the stack does not show. ``(phase, how)``; ``how`` one of ``"window and
    stack"``, ``"stack"`` (they disagree: the stack is where the write was launched; on a GPU
    the watch can see it later, never earlier), ``"window"`` (no phase frame on the stack)."""
    s_top, s_sub = _split_phase(stack_phase)
    if s_top in (None, "between phases", "start-up") and not s_sub:
        return (window_phase, "window")
    w_top, _w_sub = _split_phase(window_phase)
    if w_top is None:
        return stack_phase, "stack"
    # "start-up" / "between phases": the stack shows no top phase frame (classify's fallback),
    # so it cannot disagree with the window's
    same = w_top == s_top or (s_top == "a real step" and w_top.startswith("step ")) or \
        s_top in ("start-up", "between phases")
    if not same:
        return stack_phase, "stack"
    return (f"{w_top} › {s_sub}" if s_sub and s_sub != w_top else w_top), "window and stack"


def phase_from_watch(writer: dict, watch: dict | None, rc=None,
                     stopped: str | None = None) -> dict:
    """The phase (and step) of a named write: the window between the last boundary where the
    watch saw the tensor intact and the first where it saw it changed (or the pass's end at the
    refused write), narrowed by the launch's stack (``narrow``):

    1. the watch's value comparison saw that tensor change: the window is that change's two
       boundaries, its phase the one both boundaries' stacks show, its step the change's;
    2. the pass ended at the refused write (an exit status other than 0, not cut by the
       workbook): the window runs from the watch's last boundary to that end; only its top
       phase and step are the window's (the boundary's own sub-phase may lie after the
       launch: a kernel's fault surfaces at the next synchronization);
    3. otherwise the stack's phase (``startup.phase_from_frames``), a step without its number.

    ``{"phase", "step", "phase_source", "window"}``; ``step`` 0 is start-up, None not known;
    ``window`` ``{"from", "to"}`` (boundary labels) or None."""
    w = watch or {}
    stack_phase = writer.get("stack_phase") or writer.get("phase")
    ch = w.get("first_change")
    pos = w.get("position")
    if ch and ch.get("tensor") and ch.get("tensor") == writer.get("tensor"):
        window = {"from": ch.get("last_clean"), "to": ch.get("first_dirty")}
        wphase, step = ch["phase"], ch.get("step") or 0
        src = "the watch's value comparison (that tensor's first change"
    elif pos and pos.get("phase") and rc not in (None, 0) and not stopped:
        # the refused write never lands, so the watch saw the tensor intact at every boundary;
        # the last one may lie after the launch (a kernel's fault surfaces at the next
        # synchronization): the window is its top phase up to the pass's end
        window = {"from": None, "last_boundary": pos.get("boundary"),
                  "to": f"the pass's end at the refused write (exit {rc})"}
        wphase, step = _split_phase(pos["phase"])[0], pos.get("step") or 0
        src = (f"the watch's record: its last boundary ({pos.get('boundary')}, step "
               f"{pos.get('step') or 0}) before the pass ended at the refused write (exit {rc})")
    else:
        step = None if not stack_phase or "step" in stack_phase or \
            stack_phase.startswith("between") else 0
        return {"phase": stack_phase, "step": step, "window": None,
                "phase_source": "the Python stack of the launch (the watch's record does not "
                                "place it: " + ("the pass went on after the write"
                                                if rc in (None, 0) and not stopped
                                                else "no boundary recorded") + ")"}
    if ch and src.startswith("the watch's value") and window["from"]:
        src += f": between {window['from']} and {window['to']})"
    elif src.startswith("the watch's value"):
        src += ")"
    phase, how = narrow(wphase, stack_phase)
    if how == "stack":
        step = None if "step" in (phase or "") else 0
        src = (f"the Python stack of the launch ({phase}); {src} places it in {wphase}, "
               "later than the launch (a kernel's write can be seen after its launch, "
               "never before)")
    elif how == "window and stack" and stack_phase and " › " in (phase or "") and \
            _split_phase(phase)[1] != _split_phase(wphase)[1]:
        src += f"; the sub-phase from the launch's stack ({stack_phase})"
    return {"phase": phase, "step": step, "phase_source": src, "window": window}


def with_watch_phase(writer: dict, watch: dict | None, rc=None,
                     stopped: str | None = None) -> dict:
    """``writer`` with ``phase`` / ``step`` / ``phase_source`` from ``phase_from_watch`` and the
    stack's own reading kept as ``stack_phase``."""
    out = {**writer, "stack_phase": writer.get("stack_phase") or writer.get("phase")}
    out.update(phase_from_watch(out, watch, rc, stopped))
    return out


def _range_text(o: dict) -> str:
    """``bytes 0-3 of 4 (the whole tensor)`` for one overlap of an API write."""
    whole = " (the whole tensor)" if o.get("whole") else ""
    return f"bytes {o['first_byte']}-{o['last_byte']} of {o['tensor_nbytes']}{whole}"


def api_writer(doc: dict | None, watch: dict | None = None,
               modules: dict | None = None) -> dict | None:
    """The first write through the CUDA API into watched memory (``api_writes.json`` of
    ``workbook.hooks.watch.apiwrites``) as the writer the watch summary names: the call, the bytes
    it covered in each tensor, the launching Python frame judged by module (``name_writer``),
    and the phase and step from the watch's position recorded at the call."""
    recs = [r for r in (doc or {}).get("records") or [] if r.get("overlaps")]
    if not recs:
        return None
    r = recs[0]
    o = r["overlaps"][0]
    w = name_writer(r.get("frames") or [], modules) or {}
    pos = r.get("position") or {}
    stack_phase = w.get("phase")
    if pos.get("phase"):
        phase, step = pos["phase"], pos.get("step") or 0
        src = (f"the watch's record at the call: its last boundary ({pos.get('boundary')}, "
               f"step {pos.get('step') or 0})")
    else:
        phase, step = stack_phase, None
        src = "the Python stack of the call (the watch had no boundary yet)"
    what = (f"value {r['value']:#x}" if r.get("kind") == "memset" and r.get("value") is not None
            else f"from {r['src_hex']}" if r.get("src_hex") else None)
    return {"source": "CUPTI callback (a write through the CUDA API)", "kernel": None,
            "call": r["call"], "api_kind": r.get("kind"), "access": "write",
            "size": r.get("bytes"), "address": r.get("dst_hex"), "permission": None,
            "tensor": o["tensor"],
            "relation": "inside" if o["bytes"] == r.get("bytes") else "running into",
            "range": _range_text(o) + (f" ({what})" if what else ""),
            "tensors": [x["tensor"] for x in r["overlaps"]],
            "frame": w.get("frame"), "function": w.get("function"), "module": w.get("module"),
            "module_how": w.get("module_how"), "skipped_frames": w.get("skipped_frames", []),
            "in_forward_of": w.get("in_forward_of"), "phase": phase, "step": step,
            "phase_source": src, "stack_phase": stack_phase,
            "stack": (w.get("stack") or [])[:12], "n_api_writes": len(recs)}


def read_beside(watch_json: str, name: str) -> dict | None:
    """The JSON file ``name`` written beside a run's ``watch.json`` (None when absent or
    unreadable)."""
    import os

    try:
        with open(os.path.join(os.path.dirname(watch_json), name)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def read_api_writes(watch_json: str) -> dict | None:
    """``api_writes.json`` beside a run's ``watch.json`` (None when the subscriber wrote none)."""
    return read_beside(watch_json, "api_writes.json")


def _place(e: dict, layout: list[dict]) -> dict | None:
    addr = e.get("address")
    if addr is None or not layout:
        return None
    for t in layout:
        lo, hi = t["ptr"], t["ptr"] + t["nbytes"]
        if lo <= addr < hi:
            return {"tensor": t["name"], "relation": "inside", "offset": addr - lo}
    from workbook.run.writer import overrun

    p = overrun.place(addr, layout)
    if p["where"].startswith("red zone"):  # the read-only guard bytes (workbook.hooks.watch.redzone)
        return {"tensor": p["tensor"], "relation": f"in the {p['where']}",
                "offset": p["offset"]}
    near = e.get("nearest")
    if near is not None:
        for t in layout:
            if t["ptr"] == near["base"]:
                rel = "past the end of" if near["direction"] == "after" else "before the start of"
                return {"tensor": t["name"], "relation": rel, "distance": near["distance"]}
    best = min(layout, key=lambda t: min(abs(addr - t["ptr"]),
                                         abs(addr - (t["ptr"] + t["nbytes"]))))
    dist = min(abs(addr - best["ptr"]), abs(addr - (best["ptr"] + best["nbytes"])))
    return {"tensor": best["name"], "relation": "nearest watched tensor", "distance": dist}


def synthetic_nvtx(watch: dict, tensor: str = "reasoning_start_token_ids") -> str:
    """A memcheck log in the format NVTX memory permissions give (brief §9.2): an alias
    ``fill_`` of a read-only marker, "is not writable … inside the nearest allocation", the
    host backtrace down to the Python frames (the drafter's propose in the profiling run)."""
    t = next(x for x in watch.get("layout") or [] if x["name"] == tensor)
    return "\n".join([
        "========= COMPUTE-SANITIZER (synthetic: workbook.run.writer.sanitizer, NVTX permissions)",
        "========= Invalid __global__ write of size 4 bytes",
        "=========     at void at::native::vectorized_elementwise_kernel<4, "
        "at::native::FillFunctor<int>, std::array<char *, 1>>(int, T2, T3)+0x210",
        "=========     by thread (0,0,0) in block (0,0,0)",
        f"=========     Access to {t['ptr_hex']} is not writable and is inside the nearest "
        f"allocation at {t['ptr_hex']} of size {t['nbytes']} bytes",
        "=========     Saved host backtrace up to driver entry point at kernel launch time",
        "=========         Host Frame: cuLaunchKernel [0x2cf5b1] in libcuda.so.1",
        "=========         Host Frame: at::native::fill_kernel(at::TensorIterator&, "
        "c10::Scalar const&) [0x1a2b3c] in libtorch_cuda.so",
        "=========         Host Frame: fill_ in /opt/torch/.venv/lib/python3.12/site-packages/"
        "torch/_tensor.py:1",
        "=========         Host Frame: raw_alias_zero in /repo/workbook/hooks/faults/budget.py:219",
        "=========         Host Frame: forward in /repo/workbook/hooks/watch/writers.py:120",
        "=========         Host Frame: _call_impl in /opt/torch/.venv/lib/python3.12/"
        "site-packages/torch/nn/modules/module.py:1786",
        "=========         Host Frame: propose in /tmp/vllm-site/vllm/v1/worker/gpu/spec_decode/"
        "mtp/speculator.py:210",
        "=========         Host Frame: _dummy_run in /tmp/vllm-site/vllm/v1/worker/gpu/"
        "model_runner.py:900",
        "=========         Host Frame: profile_run in /tmp/vllm-site/vllm/v1/worker/gpu/"
        "model_runner.py:1010",
        "=========         Host Frame: determine_available_memory in /tmp/vllm-site/vllm/v1/"
        "worker/gpu_worker.py:300",
        "=========         Host Frame: <module> in /repo/workbook/run/writer/command.py:250",
        "=========         Host Frame: _start [0x1234] in python3",
        "=========",
        "========= ERROR SUMMARY: 1 error",
        ""])


def synthetic(watch: dict) -> str:
    """A memcheck-style log whose one error writes 4 bytes past the first marker tensor of
    ``watch`` (for the CPU dry run of the sanitizer stage: the parser and the tie)."""
    layout = watch.get("layout") or []
    t = next((x for x in layout if x["name"].startswith("reasoning_start")), layout[0])
    addr = t["ptr"] + max(t["nbytes"], 4) + 508
    return "\n".join([
        "========= COMPUTE-SANITIZER (synthetic: workbook.run.writer.sanitizer --synthetic)",
        "========= Invalid __global__ write of size 4 bytes",
        "=========     at rogue_zero_kernel+0x1b0 in /tmp/rogue.py:12",
        "=========     by thread (0,0,0) in block (0,0,0)",
        f"=========     Address {hex(addr)} is out of bounds",
        f"=========     and is {addr - t['ptr'] - t['nbytes']:,} bytes after the nearest "
        f"allocation at {t['ptr_hex']} of size {t['nbytes']:,} bytes",
        "=========     Saved host backtrace up to driver entry point at kernel launch time",
        "=========     Host Frame: cuLaunchKernel [0x2cf5b1] in libcuda.so.1",
        "=========",
        "========= ERROR SUMMARY: 1 error",
        ""])


def read_modules(watch_json: str) -> dict | None:
    """The child's module table written beside its ``watch.json`` (``modules.json``)."""
    return read_beside(watch_json, "modules.json")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("log", nargs="?", help="compute-sanitizer log file")
    ap.add_argument("--watch", help="the run's watch.json (for the addresses)")
    ap.add_argument("-o", "--output", help="write the tied report as JSON here")
    ap.add_argument("--synthetic", metavar="WATCH_JSON",
                    help="print a sample memcheck log for this watch.json and exit")
    a = ap.parse_args(argv)
    if a.synthetic:
        with open(a.synthetic) as f:
            sys.stdout.write(synthetic(json.load(f)))
        return 0
    if not a.log:
        ap.error("LOG is required")
    with open(a.log, errors="replace") as f:
        parsed = parse(f.read())
    watch = None
    if a.watch:
        with open(a.watch) as f:
            watch = json.load(f)
    report = tie(parsed, watch, modules=read_modules(a.watch) if a.watch else None)
    if a.output:
        with open(a.output, "w") as f:
            json.dump(report, f, indent=1, default=str)
    summ = report["error_summary"]
    print(f"memcheck: {report['n_errors']} error(s) ("
          + (f"summary line: {summ}" if summ is not None else "no summary line: the log was cut")
          + f"); touching watched memory: {report['touching_watched']}; NVTX calls refused: "
          f"{report['protection']['refused']}")
    print(report["verdict"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
