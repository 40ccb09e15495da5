"""Reading the start-up watch: the verdict on the budget state's integrity, tables, a summary.

``verdict_from_watch(watch)`` turns ``watch.json`` (``workbook.hooks.watch``) into the
``integrity`` section of ``verdict.json``::

    {"hypothesis": "H-i" | "H-i-inband" | None, "verdict": "corrupted" | "intact" | "not watched",
     "phase": "profiling run › target forward", "module": "target.model.layers.0.mlp",
     "op": "aten.fill_.Scalar", "tensors": [...], "before": ..., "after": ..., "saw": "...",
     "confirm": "..."}

``phase_table`` / ``timeline_table`` / ``changes_table`` are the notebook's views (pandas);
``summary(watch)`` the lines ``workbook watch`` prints. Nothing here reads vLLM.
"""

from __future__ import annotations

from typing import Any

CONFIRM = ("re-run with localize='op' (and localize_within=<module>) to name the op or kernel "
           "launch; on a GPU run the same start-up under compute-sanitizer memcheck "
           "(scripts/integrity_sanitizer.sh); the budget guard (guard=True) holds regardless")


def _first(watch: dict) -> dict | None:
    return (watch or {}).get("first_change")


def _top(phase: str | None) -> str | None:
    return phase.split(" › ")[0] if phase else None


def startup_reach(watch: dict | None, stopped: str | None = None, rc=None) -> dict:
    """How far the watched start-up got: ``{"complete", "phases_run", "last_phase", "why"}``.

    Complete when the watch saw a real step begin (every start-up phase ran before it) or the
    pass's process ended on its own with status 0. Otherwise the pass stopped in its last
    phase, and ``why`` says why: the pass's own reason (``stopped``, e.g. its time limit), its
    exit status, or that the watch's record simply ends there."""
    w = watch or {}
    phases = list(w.get("phase_order") or [])
    real = (w.get("steps") or {}).get("real_steps") or 0
    stepped = bool(real or w.get("first_real_step_phase")
                   or any(p.startswith("step ") for p in phases))
    complete = stepped or (rc == 0 and not stopped)
    if stopped:
        why = stopped
    elif rc not in (None, 0):
        why = f"the pass's process exited with status {rc}"
    else:
        why = "the watch's record ends there"
    return {"complete": complete, "phases_run": phases,
            "last_phase": phases[-1] if phases else None, "why": None if complete else why}


def incomplete_text(reach: dict) -> str:
    """The sentence for a start-up that did not finish under the watch."""
    phases = reach.get("phases_run") or []
    where = (f"stopped in {reach['last_phase']}" if reach.get("last_phase")
             else "stopped before any watched phase")
    ran = (f"the phases that ran ({' → '.join(phases)}) changed no watched tensor"
           if phases else "no phase ran under the watch")
    return (f"start-up incomplete: the pass {where} ({reach.get('why')}), before the first real "
            f"step; {ran}; the phases after it were not watched, so nothing is known of them")


def verdict_from_watch(watch: dict | None, stopped: str | None = None,
                       rc=None) -> dict[str, Any]:
    """The watch's reading: was the budget state changed by something not allowed to?

    ``stopped`` / ``rc``: how the pass that wrote ``watch`` ended (``workbook.run.writer.command``);
    a start-up that did not finish and saw no change reads ``incomplete``, never ``intact``."""
    if not watch:
        return {"hypothesis": None, "verdict": "not watched", "saw": "no watch evidence"}
    if not watch.get("state_found"):
        return {"hypothesis": None, "verdict": "not watched",
                "saw": watch.get("error") or "the engine never created a ThinkingBudgetState "
                "under the watch (start-up failed, or no Model Runner V2 was built)"}
    ch = _first(watch)
    loc = watch.get("localization") or {}
    alias = loc.get("alias_writes") or []
    launches = loc.get("suspect_launches") or []
    observed = watch.get("startup_observed", True)
    base = {"startup_observed": observed, "phases_run": watch.get("phase_order", []),
            "localization": {k: loc.get(k) for k in ("level", "complete", "stopped", "checks")}}
    reach = startup_reach(watch, stopped, rc)
    if ch is None and not reach["complete"]:
        return {**base, "hypothesis": None, "verdict": "incomplete",
                "stopped_in": reach["last_phase"], "stop_reason": reach["why"],
                "saw": incomplete_text(reach), "confirm": None}
    if ch is None:
        return {**base, "hypothesis": None, "verdict": "intact",
                "saw": "no watched tensor changed outside its allowed writers "
                       f"({watch.get('steps', {}).get('real_steps', 0)} real steps watched)",
                "confirm": None}
    moved = sorted({c["tensor"] for c in watch.get("changes", [])
                    if c.get("top_phase") == ch.get("top_phase")})
    op = ch.get("op")
    # an aliasing write seen by the op level names the op even between value checks
    named = next((a for a in alias if a.get("tensor") == ch["tensor"]), None)
    if op is None and named is not None:
        op = named["op"]
    kernel = op[len("triton:"):] if op and op.startswith("triton:") else None
    module = ch.get("module") or (named or {}).get("module")
    ver = ch.get("version") or [None, None]
    oob = bool(named and named.get("alias")) or (not ch.get("ptr_moved") and ver[0] == ver[1])
    how = ("through an alias of its storage" if named and named.get("alias")
           else "with no PyTorch write to the tensor itself" if oob
           else "by a PyTorch write (in band)")
    where = ch["phase"] + (f", in {module}" if module else "") + \
        (f", by {op}" if op else "") + (f" (between {ch['last_clean']} and "
                                        f"{ch['first_dirty']})" if not op else "")
    ptr = {True: "storage pointer moved", False: "storage pointer unchanged"}.get(
        ch.get("ptr_moved"), "storage pointer not compared")
    vers = (f"_version {ch.get('version')}" if None not in ver
            else "_version not readable (an inference tensor)")
    saw = (f"{ch['tensor']} ({ch['role']}) changed {ch['before']} → {ch['after']} during "
           f"{where}{'; ' + how if how else ''}; {ptr}, {vers}; tensors changed in that "
           f"phase: {moved}")
    return {**base, "hypothesis": "H-i" if oob else "H-i-inband", "verdict": "corrupted",
            "phase": ch["phase"],
            "top_phase": ch.get("top_phase"), "step": ch.get("step"), "module": module,
            "op": op, "kernel": kernel, "tensors": moved, "tensor": ch["tensor"],
            "before": ch["before"], "after": ch["after"], "last_clean": ch["last_clean"],
            "first_dirty": ch["first_dirty"], "alias_write": named,
            "suspect_launches": launches[:5], "saw": saw, "confirm": CONFIRM}


# what every rank's reading must share: each rank holds its own copy of the state, built by
# the same start-up, so a rank that read otherwise is a finding of its own
RANK_FIELDS = ("verdict", "hypothesis", "phase", "module", "op", "tensor", "before", "after")


def verdict_from_watches(watch: dict | None, stopped: str | None = None, rc=None) -> dict:
    """The integrity reading over every rank's copy of the state (several ranks: ``watch``
    carries ``ranks``, ``{"pp<p>/tp<t>": that rank's watch.json}``, the reference rank first).

    Each rank is read by ``verdict_from_watch``; the section is the reference rank's reading,
    unless another rank saw its state changed while the reference did not: then that rank's
    (a corruption in any rank's copy is a corruption). ``ranks`` holds every rank's verdict and
    sentence, ``rank_agreement`` where they differ (``workbook.core.ranks.compare``)."""
    per = (watch or {}).get("ranks")
    if not per:
        return verdict_from_watch(watch, stopped, rc)
    from workbook.core import ranks

    readings = {lab: verdict_from_watch(w, stopped, rc) for lab, w in per.items()}
    labels = list(readings)
    lead = labels[0]
    if readings[lead]["verdict"] != "corrupted":
        lead = next((lab for lab in labels if readings[lab]["verdict"] == "corrupted"), lead)
    out = dict(readings[lead])
    out["rank"] = lead
    out["ranks"] = {lab: {"tp_rank": per[lab].get("tp_rank"), "pp_rank": per[lab].get("pp_rank"),
                          "verdict": r["verdict"], "hypothesis": r.get("hypothesis"),
                          "saw": r.get("saw")} for lab, r in readings.items()}
    out["rank_agreement"] = ranks.compare(readings, RANK_FIELDS)
    if not out["rank_agreement"]["agree"]:
        odd = sorted({d["rank"] for d in out["rank_agreement"]["differences"]})
        out["saw"] = (f"{out.get('saw')}; the ranks' copies of the state read differently "
                      f"({', '.join(odd)} against {labels[0]}): a finding of its own")
    return out


def phase_table(watch: dict):
    """One row per phase that ran, in order: first / last time, boundaries, unexpected."""
    import pandas as pd

    return pd.DataFrame(watch.get("phases") or [],
                        columns=["phase", "first_t", "last_t", "boundaries", "unexpected"])


def timeline_table(watch: dict, only_changes: bool = False):
    import pandas as pd

    rows = []
    for e in watch.get("timeline") or []:
        if only_changes and not e.get("changed"):
            continue
        rows.append({"t": e["t"], "phase": e["phase"], "boundary": f"{e['kind']} {e['where']}",
                     **{f"marker {k}": v for k, v in (e.get("markers") or {}).items()},
                     "changed": ", ".join(e.get("changed") or []),
                     "unexpected": ", ".join(e.get("unexpected") or [])})
    return pd.DataFrame(rows)


def changes_table(watch: dict):
    import pandas as pd

    cols = ["tensor", "role", "phase", "step", "module", "op", "before", "after", "ptr_moved",
            "version", "last_clean", "first_dirty"]
    return pd.DataFrame([{k: c.get(k) for k in cols} for c in watch.get("changes") or []],
                        columns=cols)


def _or(v, missing: str) -> str:
    return missing if v is None or v == "" else str(v)


def watched_text(watch: dict | None, stopped: str | None = None, rc=None,
                 writer: dict | None = None) -> str:
    """What was and was not watched, for the line under a named writer: the phases and steps
    the watch saw, where the pass ended (at the refused write, when it ended with an error
    after a named write), and what the values did."""
    if not watch:
        return "nothing (no watch evidence)"
    reach = startup_reach(watch, stopped, rc)
    phases = watch.get("phase_order") or []
    n = (watch.get("steps") or {}).get("real_steps") or 0
    v = verdict_from_watch(watch, stopped, rc)
    values = (f"the watch's values: {v['saw']}" if v.get("verdict") == "corrupted" else
              "no watched value changed")
    refused = writer and rc not in (None, 0) and not stopped
    if reach["complete"]:
        end = (f"until the pass ended at the refused write (exit {rc})" if refused else
               "to the end of the pass")
        return f"start-up ({len(phases)} phases) and {n} real step(s), {end}; {values}"
    ran = " → ".join(phases) if phases else "no phase"
    end = "ended at the refused write" if refused else "stopped"
    return (f"{ran}; the pass {end} in {reach['last_phase'] or 'no watched phase'} "
            f"({reach['why']}), so the phases after it were not watched; {values} before that")


def summary(watch: dict | None, stopped: str | None = None, rc=None,
            writer: dict | None = None) -> list[str]:
    """Human-readable lines (``workbook watch``); ``stopped`` / ``rc`` as for
    ``verdict_from_watch``. With ``writer`` (the sanitizer stage named one) the headline is the
    writer, then what was and was not watched, in place of the watch's own verdict line."""
    v = verdict_from_watch(watch, stopped, rc)
    if writer:
        head = [f"WRITER: {writer_text(writer)}",
                f"WATCHED: {watched_text(watch, stopped, rc, writer)}"]
        if not watch:
            return head
        return head + [ln for ln in summary(watch, stopped, rc)
                       if not ln.startswith(("INTACT:", "INCOMPLETE:", "NOT WATCHED:"))]
    if not watch:
        return ["no watch evidence"]
    observed = "yes" if watch.get("startup_observed") else "no"
    lines = [f"vLLM {_or(watch.get('vllm_version'), 'version unknown')} on "
             f"{_or(watch.get('device'), 'an unnamed device')} "
             f"({_or(watch.get('platform'), 'platform unknown')}); start-up observed: {observed}",
             "phases that ran: " + (" → ".join(watch.get("phase_order") or [])
                                    or "none recorded")]
    for t in watch.get("layout") or []:
        lines.append(f"  {t['ptr_hex']} +{t['offset']:<8d} {t['nbytes']:6d} B  {t['name']}")
    if v["verdict"] == "corrupted":
        lines += [f"FIRST UNEXPECTED CHANGE: {v['saw']}",
                  f"  phase:  {v['phase']}", f"  module: {v.get('module') or '-'}",
                  f"  op:     {v.get('op') or '-'}",
                  f"  last clean check: {_or(v.get('last_clean'), 'none recorded')}",
                  f"  first dirty check: {_or(v.get('first_dirty'), 'none recorded')}"]
        for a in (v.get("suspect_launches") or [])[:3]:
            lines.append(f"  Triton launch handed a watched pointer: {a}")
    else:
        lines.append(f"{v['verdict'].upper()}: {v.get('saw')}")
    loc = watch.get("localization") or {}
    if loc.get("level") not in (None, "none"):
        lines.append(f"localization: level {loc.get('level')}, {_or(loc.get('checks'), 0)} "
                     f"checks in {_or(loc.get('elapsed_s'), '?')} s"
                     + (f"; {loc['stopped']}" if loc.get("stopped") else ""))
    ov = watch.get("overhead") or {}
    lines.append(f"watch cost: start-up {_or(ov.get('startup_checks'), 0)} checks "
                 f"{_or(ov.get('startup_check_s'), 0.0)} s; steps {_or(ov.get('step_checks'), 0)} "
                 f"checks {_or(ov.get('step_check_s'), 0.0)} s")
    return lines


def culprit_text(c: dict | None) -> str:
    """One sentence for a ``watch-summary.json`` culprit (the PROBE line, the notebook)."""
    c = c or {}
    verdict = c.get("verdict")
    if verdict == "corrupted":
        where = f" during {c['phase']}" if c.get("phase") else ""
        mod = f", in {c['module']}" if c.get("module") else ""
        return f"corrupted{where}{mod}"
    if verdict == "incomplete":  # its sentence begins "start-up incomplete"
        return _or(c.get("saw"), "start-up incomplete (no sentence recorded)")
    if verdict in ("intact", "not watched"):
        return f"{verdict}: {_or(c.get('saw'), 'no sentence recorded')}"
    return "no verdict (no pass left watch evidence)"


# ---- the sanitizer stage's writer (workbook.run.writer.stage) ------------------------------------

def with_writer(section: dict, writer: dict | None) -> dict:
    """The ``integrity`` section with the writer the sanitizer stage named: a protected write
    is corruption whether or not the value changed (on CPU the write never lands)."""
    if not writer:
        return section
    out = {**section, "writer": writer}
    if out.get("verdict") != "corrupted":
        tensor = writer.get("tensor") or "a protected budget-state tensor"
        out.update(hypothesis="H-i", verdict="corrupted",
                   phase=writer.get("phase") or out.get("phase"),
                   saw=f"a write to {tensor} was refused and named: {writer_text(writer)}")
    return out


def writer_text(w: dict) -> str:
    parts = [f"kernel {w['kernel']}" if w.get("kernel") else None,
             f"CUDA API call {w['call']}" if w.get("call") else None,
             f"{w.get('access') or 'write'} of {w['size']} bytes" if w.get("size") else None,
             f"{w['relation']} {w['tensor']}" if w.get("tensor") and w.get("relation") else None,
             w.get("range"),
             (f"from {w['frame']}" + (f" (module {w['module']})" if w.get("module") else ""))
             if w.get("frame") else None,
             f"during {w['phase']}" + _source_tag(w.get("phase_source"))
             if w.get("phase") else None]
    return ", ".join(p for p in parts if p) or "no frame recorded"


def _source_tag(src: str | None) -> str:
    if not src:
        return ""
    if src.startswith("the watch's value"):
        return " (the watch's values)"
    if src.startswith("the watch's record"):
        return " (the watch's record)"
    if src.startswith("the Python stack of the call"):
        return " (the call's Python stack)"
    return " (the launch's Python stack)"


def writer_lines(stage: dict, writer: dict | None) -> list[str]:
    """What ``workbook watch`` prints about the sanitizer stage of one pass."""
    mode = (stage or {}).get("mode", "none")
    if mode == "skipped":
        return [f"sanitizer stage: {_or(stage.get('message'), 'skipped (no reason recorded)')}"]
    lines = [f"sanitizer stage ({mode}): "
             f"{_or(stage.get('verdict'), 'no verdict (the stage recorded none)')}"]
    if writer:
        lines.append(f"FIRST WRITER: {writer_text(writer)}")
        if writer.get("phase_source"):
            lines.append(f"  phase from {writer['phase_source']}")
        if writer.get("skipped_frames"):
            lines.append("  launch frames passed over (library machinery): "
                         + "; ".join(writer["skipped_frames"][:6]))
        for f in (writer.get("stack") or [])[:6]:
            lines.append(f"    {f}")
    if stage.get("api_writes"):
        lines.append(f"CUDA API watcher (CUPTI): {stage['api_writes']}")
    return lines


def _side(s: dict | None) -> dict | None:
    """One layout's ``watch-summary.json`` → symptom, the phase it showed in, how far it got."""
    if not s:
        return None
    c = s.get("culprit") or {}
    passes = s.get("passes") or []
    phases: list[str] = []
    for p in passes:
        for ph in ((p.get("verdict") or {}).get("phases_run") or []):
            if ph not in phases:
                phases.append(ph)
    complete = any(ph.startswith("step ") for ph in phases) or any(
        p.get("rc") == 0 and not p.get("stopped") for p in passes)
    last = next((p for p in reversed(passes)), {}) if passes else {}
    hit = bool(c.get("verdict") == "corrupted" or c.get("writer"))
    full = c.get("phase") or (c.get("writer") or {}).get("phase")
    ext = (c.get("writer") or {}).get("extent")  # the writer's access range (run.overrun)
    return {"hit": hit, "phase": _top(full), "where": full, "extent": ext,
            "phases": phases, "complete": complete,
            "why": last.get("stopped") or (f"exit status {last.get('rc')}"
                                           if last.get("rc") not in (None, 0) else
                                           "its record ends there")}


def _reached(side: dict, phase: str | None) -> bool:
    """Did this pass get past ``phase`` (or through the whole start-up)?"""
    if side["complete"]:
        return True
    return phase is not None and phase in side["phases"] and side["phases"][-1] != phase


def _short_of(name: str, side: dict, phase: str | None) -> str:
    last = side["phases"][-1] if side["phases"] else "no watched phase"
    target = f"the end of {phase}, where the other layout's change came" if phase else \
        "the end of start-up"
    return f"inconclusive: the {name} pass stopped in {last} ({side['why']}) before {target}"


def layout_ab(caching_on: dict | None, caching_off: dict | None) -> dict:
    """The caching-allocator A/B (two ``watch-summary.json``): the symptom (a corrupted
    verdict or a named writer) in one layout and not the other is evidence about the layout
    only when the clean pass got past the phase where the other saw the change; no symptom in
    either only when both start-ups finished. Otherwise the reading is ``inconclusive: <which
    pass> stopped in <phase> before <phase of the change>``. Either summary missing →
    undecided. The writer's access range (``workbook.run.writer.overrun``: memcheck's faulting
    accesses against the markers' red zones) decides between the two ways a writer reaches a
    marker: ``overrun`` when in either layout an access lies outside the marker on the way into
    it (or in its red zone), ``a pointer write`` only when in both layouts every faulting
    access lies inside it; a hit in both without such ranges says it cannot tell."""
    on, off = _side(caching_on), _side(caching_off)
    runs = [(n, s["extent"]) for n, s in (("caching on", on), ("caching off", off))
            if s is not None and s["hit"] and (s["extent"] or {}).get("kind") in
            ("overrun", "red zone")]
    inside = [s for s in (on, off) if s is not None and s["hit"] and
              (s["extent"] or {}).get("kind") == "inside"]
    if runs:
        reading = ("overrun: " + "; ".join(f"with {n}, the write {e['sentence']}"
                                           for n, e in runs)
                   + " — an access crosses into the marker's surroundings, so the writer is "
                   "a neighbour's write running in, not one that holds the marker's address")
    elif on is None or off is None:
        reading = "undecided: one of the two layouts has no summary"
    elif on["hit"] and off["hit"] and len(inside) == 2:
        reading = ("a pointer write: the writer finds the markers in either layout, and every "
                   "faulting access lies inside the marker in both (it holds their address or "
                   "an alias)")
    elif on["hit"] and off["hit"]:
        reading = ("in either layout: the writer reaches the markers with the caching "
                   "allocator on and off; no access range in both (the sanitizer stage's "
                   "faulting accesses, with red zones) tells a pointer write from an overrun")
    elif on["hit"] and not _reached(off, on["phase"]):
        reading = _short_of("caching-off", off, on["phase"])
    elif off["hit"] and not _reached(on, off["phase"]):
        reading = _short_of("caching-on", on, off["phase"])
    elif on["hit"]:
        reading = (f"layout-dependent: the change during {on['where']} comes with the caching "
                   "allocator and is gone with each tensor in its own allocation, past the same "
                   "phase — consistent with a neighbour's overrun into the markers' segment "
                   "(watch.json's layout evidence lists the neighbours)")
    elif off["hit"]:
        reading = (f"seen only with caching off: the change during {off['where']} is gone with "
                   "the caching allocator, past the same phase — a write whose target depends "
                   "on the uncached layout")
    elif not on["complete"]:
        reading = _short_of("caching-on", on, None)
    elif not off["complete"]:
        reading = _short_of("caching-off", off, None)
    else:
        reading = "no symptom in either layout (both start-ups finished under the watch)"
    return {"caching_on": None if on is None else on["hit"],
            "caching_off": None if off is None else off["hit"], "reading": reading}
