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


def verdict_from_watch(watch: dict | None) -> dict[str, Any]:
    """The watch's reading: was the budget state changed by something not allowed to?"""
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
    saw = (f"{ch['tensor']} ({ch['role']}) changed {ch['before']} → {ch['after']} during "
           f"{where}{'; ' + how if how else ''}; storage pointer "
           f"{'moved' if ch.get('ptr_moved') else 'unchanged'}, _version "
           f"{ch.get('version')}; tensors changed in that phase: {moved}")
    return {**base, "hypothesis": "H-i" if oob else "H-i-inband", "verdict": "corrupted",
            "phase": ch["phase"],
            "top_phase": ch.get("top_phase"), "step": ch.get("step"), "module": module,
            "op": op, "kernel": kernel, "tensors": moved, "tensor": ch["tensor"],
            "before": ch["before"], "after": ch["after"], "last_clean": ch["last_clean"],
            "first_dirty": ch["first_dirty"], "alias_write": named,
            "suspect_launches": launches[:5], "saw": saw, "confirm": CONFIRM}


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


def summary(watch: dict | None) -> list[str]:
    """Human-readable lines (``workbook watch``)."""
    v = verdict_from_watch(watch)
    if not watch:
        return ["no watch evidence"]
    lines = [f"vLLM {watch.get('vllm_version')} on {watch.get('device')} "
             f"({watch.get('platform')}); start-up observed: {watch.get('startup_observed')}",
             "phases that ran: " + " → ".join(watch.get("phase_order") or [])]
    for t in watch.get("layout") or []:
        lines.append(f"  {t['ptr_hex']} +{t['offset']:<8d} {t['nbytes']:6d} B  {t['name']}")
    if v["verdict"] == "corrupted":
        lines += [f"FIRST UNEXPECTED CHANGE: {v['saw']}",
                  f"  phase:  {v['phase']}", f"  module: {v.get('module') or '-'}",
                  f"  op:     {v.get('op') or '-'}",
                  f"  last clean check: {v['last_clean']}",
                  f"  first dirty check: {v['first_dirty']}"]
        for a in (v.get("suspect_launches") or [])[:3]:
            lines.append(f"  Triton launch handed a watched pointer: {a}")
    else:
        lines.append(f"{v['verdict'].upper()}: {v.get('saw')}")
    loc = watch.get("localization") or {}
    if loc.get("level") not in (None, "none"):
        lines.append(f"localization: level {loc.get('level')}, {loc.get('checks')} checks in "
                     f"{loc.get('elapsed_s')} s; {loc.get('stopped')}")
    ov = watch.get("overhead") or {}
    lines.append(f"watch cost: start-up {ov.get('startup_checks')} checks "
                 f"{ov.get('startup_check_s')} s; steps {ov.get('step_checks')} checks "
                 f"{ov.get('step_check_s')} s")
    return lines


# ---- the sanitizer stage's writer (workbook.run.sanistage) ------------------------------------

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
             f"{w.get('access') or 'write'} of {w['size']} bytes" if w.get("size") else None,
             f"{w['relation']} {w['tensor']}" if w.get("tensor") and w.get("relation") else None,
             (f"from {w['frame']}" + (f" (module {w['module']})" if w.get("module") else ""))
             if w.get("frame") else None,
             f"during {w['phase']}" if w.get("phase") else None]
    return ", ".join(p for p in parts if p) or "no frame recorded"


def writer_lines(stage: dict, writer: dict | None) -> list[str]:
    """What ``workbook watch`` prints about the sanitizer stage of one pass."""
    mode = (stage or {}).get("mode", "none")
    if mode == "skipped":
        return [f"sanitizer stage: {stage.get('message')}"]
    lines = [f"sanitizer stage ({mode}): {stage.get('verdict')}"]
    if writer:
        lines.append(f"FIRST WRITER: {writer_text(writer)}")
        for f in (writer.get("stack") or [])[:6]:
            lines.append(f"    {f}")
    return lines


def layout_ab(caching_on: dict | None, caching_off: dict | None) -> dict:
    """The caching-allocator A/B (two ``watch-summary.json``): the symptom (a corrupted
    verdict or a named writer) gone with caching off → layout-dependent (a neighbour's
    overrun); still there → a write that finds the markers wherever they are (a pointer
    write). Either summary missing → undecided."""
    def hit(s):
        if not s:
            return None
        c = s.get("culprit") or {}
        return bool(c.get("verdict") == "corrupted" or c.get("writer"))

    on, off = hit(caching_on), hit(caching_off)
    if on is None or off is None:
        reading = "undecided: one of the two layouts has no summary"
    elif on and not off:
        reading = ("layout-dependent: the symptom is gone with each tensor in its own "
                   "allocation — a neighbour's overrun into the markers' segment")
    elif on and off:
        reading = ("a pointer write: the writer finds the markers in either layout (it holds "
                   "their address or an alias)")
    elif off and not on:
        reading = "seen only with caching off: a write that depends on the uncached layout"
    else:
        reading = "no symptom in either layout"
    return {"caching_on": on, "caching_off": off, "reading": reading}
