"""A writer's whole access range, from memcheck's faulting accesses, relative to the markers.

memcheck reports every access a kernel makes to memory that is not writable (a read-only
marker, its red zones: ``workbook.hooks.watch.redzone``) or outside every allocation, one record per
thread and access, each with its address and size (``workbook.run.writer.sanitizer.parse``). It does
not report accesses to writable memory. So the faulting accesses of one launch (``launches``:
consecutive records of the same kernel and Python stack) span what the writer did to the
protected bytes and their surroundings, and ``extent`` reads them against the run's layout
(the watched tensors with their red zones: ``watch.json``'s ``layout``):

- every access inside one watched tensor: ``inside`` — the writer finds the tensor itself (a
  pointer or an alias); the only reading in which "a pointer write" is said;
- accesses inside a tensor and others below (above) it — in its red zone, in another tensor or
  its red zone, outside any allocation: ``overrun`` — "runs N bytes into X from below, starting
  in <where the lowest access lies>";
- accesses in a red zone only: ``red zone`` — the write ran toward a marker and no faulting
  access reached it (memcheck may have ended the kernel first, or the write stops there);
- none in watched memory or a red zone: ``outside``.

Where the far end lies is said as the evidence allows: a red zone's first byte faulting means the
write began there *or below it*, in writable memory memcheck does not check (the block below is
named from the layout evidence when the caching allocator's segments were read); an access
outside every allocation carries memcheck's own "N bytes before the nearest allocation at …".

Rule source: what a write that "runs in from a neighbour" must leave in the evidence (accesses on
both sides of the marker's first byte), never the shape of the workbook's own overrun writer.
"""

from __future__ import annotations

from workbook.vllm.startup import STATE_TENSORS

ACCESS_PREFIX = "Invalid __global__"


def _is_marker(name: str | None) -> bool:
    return STATE_TENSORS.get(name or "") == "marker"


def _lo_of(t: dict) -> int:
    return ((t.get("redzone") or {}).get("below") or [t["ptr"]])[0]


def _hi_of(t: dict) -> int:
    return ((t.get("redzone") or {}).get("above") or [0, t["ptr"] + t["nbytes"]])[1]


def toward(lo: int, hi: int, layout: list[dict], side: str) -> str | None:
    """The nearest marker beyond one end of a range not covering it (``side`` "above": past
    its highest byte ``hi``; "below": under its lowest ``lo``), and how far: the distance is
    evidence (addresses), whether the write gets there is not."""
    if side == "above":
        cands = [t for t in layout if _is_marker(t["name"]) and t["ptr"] >= hi]
        t = min(cands, key=lambda t: t["ptr"], default=None)
        if t is None:
            return None
        zone = t["ptr"] - _lo_of(t)
        return (f"its highest access ends {_lo_of(t) - hi} bytes below the red zone below "
                f"{t['name']}, {t['ptr'] - hi} bytes below the marker itself"
                if zone else f"its highest access ends {t['ptr'] - hi} bytes below {t['name']}")
    cands = [t for t in layout if _is_marker(t["name"]) and t["ptr"] + t["nbytes"] <= lo]
    t = max(cands, key=lambda t: t["ptr"], default=None)
    if t is None:
        return None
    end = t["ptr"] + t["nbytes"]
    zone = _hi_of(t) - end
    return (f"its lowest access starts {lo - _hi_of(t)} bytes above the red zone above "
            f"{t['name']}, {lo - end} bytes above the marker itself"
            if zone else f"its lowest access starts {lo - end} bytes above {t['name']}")


def points_at(records: list[dict], layout: list[dict]) -> str | None:
    """A marker memcheck's own access line names: an access "N bytes before / after the
    nearest allocation at <the marker's padded block or the marker>"."""
    for r in records:
        near = r.get("nearest") or {}
        if near.get("direction") not in ("before", "after"):
            continue
        t = next((t for t in layout if _is_marker(t["name"]) and near["base"] in
                  (t["ptr"], (t.get("redzone") or {}).get("base"))), None)
        if t is not None:
            block = "its padded block" if near["base"] != t["ptr"] else "the marker"
            return (f"memcheck's access line points at {t['name']} ({block} at "
                    f"{hex(near['base'])} is the nearest allocation, {near['distance']:,} "
                    f"bytes {'above' if near['direction'] == 'before' else 'below'} the access "
                    f"at {hex(r['address'])})")
    return None


def _frames_key(e: dict) -> tuple:
    return tuple((f["func"], f["file"], f["line"]) for f in e.get("python_frames") or [])


def launches(errors: list[dict]) -> list[dict]:
    """Consecutive access records of one kernel and one launching stack → one launch:
    ``{"kernel", "access", "records": [...], "accesses": [(address, size), ...]}``."""
    out: list[dict] = []
    for e in errors:
        if not (e.get("kind") or "").startswith(ACCESS_PREFIX) or e.get("address") is None:
            continue
        key = (e.get("kernel"), e.get("access"), _frames_key(e))
        if out and out[-1]["key"] == key:
            cur = out[-1]
        else:
            cur = {"key": key, "kernel": e.get("kernel"), "access": e.get("access"),
                   "records": [], "accesses": []}
            out.append(cur)
        cur["records"].append(e)
        cur["accesses"].append((e["address"], e.get("size") or 1))
    for c in out:
        c.pop("key")
    return out


def _zones(t: dict):
    z = t.get("redzone") or {}
    return z.get("below"), z.get("above")


def place(addr: int, layout: list[dict]) -> dict:
    """Where one address lies: ``{"where": "inside" | "red zone below" | "red zone above" |
    "elsewhere", "tensor", "offset"}`` (offset from the tensor's first byte; for a red zone
    below, negative)."""
    for t in layout:
        lo, hi = t["ptr"], t["ptr"] + t["nbytes"]
        if lo <= addr < hi:
            return {"where": "inside", "tensor": t["name"], "offset": addr - lo}
        below, above = _zones(t)
        if below and below[0] <= addr < below[1]:
            return {"where": "red zone below", "tensor": t["name"], "offset": addr - lo}
        if above and above[0] <= addr < above[1]:
            return {"where": "red zone above", "tensor": t["name"], "offset": addr - lo}
    return {"where": "elsewhere", "tensor": None, "offset": None}


def _union(ivs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for lo, hi in sorted(ivs):
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return [(a, b) for a, b in out]


def _covered(ivs, lo: int, hi: int) -> int:
    return sum(max(0, min(b, hi) - max(a, lo)) for a, b in ivs)


def _neighbour_below(name: str, evidence: dict | None, base: int, ptr: int) -> str | None:
    """The caching-allocator block just below ``base`` (the padded buffer, or the tensor
    itself) from the layout evidence (``alloc_layout.neighbours``: offsets from the tensor)."""
    return _neighbour(name, evidence, lambda b: ptr + b["offset"] + b["size"] == base)


def _neighbour_above(name: str, evidence: dict | None, end: int, ptr: int) -> str | None:
    return _neighbour(name, evidence, lambda b: ptr + b["offset"] == end)


def _neighbour(name: str, evidence: dict | None, pick) -> str | None:
    for key in ("after_startup", "at_state_creation"):
        t = (((evidence or {}).get(key) or {}).get("tensors") or {}).get(name) or {}
        b = next((b for b in t.get("neighbours") or [] if pick(b)), None)
        if b is None:
            continue
        if b.get("watched") and b.get("watched") != name:
            return f"the block of {b['watched']} ({b['size']} bytes)"
        state = {"active_allocated": "an allocated", "inactive": "a free",
                 "active_pending_free": "a freed (pending)"}.get(b.get("state"), "a")
        what = f"{state} block of {b['size']} bytes"
        if b.get("allocated_by"):
            what += f" allocated by {b['allocated_by'][0]}"
        return what
    return None


def _oob(rec: dict) -> str:
    near = rec.get("nearest") or {}
    if near.get("direction") in ("before", "after"):
        return (f"outside any allocation ({near['distance']:,} bytes {near['direction']} the "
                f"allocation at {hex(near['base'])} of {near['size']:,} bytes)")
    return "outside any allocation"


def _far_end(addr: int, end: int, rec: dict | None, layout: list[dict], side: str,
             evidence: dict | None) -> str:
    """Where the far end of a range lies: its lowest access ``addr`` (``side`` "below") or its
    highest access ``addr`` ending at ``end`` (``side`` "above")."""
    p = place(addr if side == "below" else end - 1, layout)
    if p["where"] == "inside":
        t = next(t for t in layout if t["name"] == p["tensor"])
        return f"in {p['tensor']} (its byte {p['offset']} of {t['nbytes']})"
    if p["where"].startswith("red zone"):
        t = next(t for t in layout if t["name"] == p["tensor"])
        below, above = _zones(t)
        zone = below if p["where"] == "red zone below" else above
        zname = f"the {p['where']} {p['tensor']}"
        if side == "below" and addr == zone[0]:
            nb = _neighbour_below(p["tensor"], evidence, zone[0], t["ptr"])
            return (f"at the first byte of {zname} (the range may go on below it, in writable "
                    "memory that memcheck does not check" + (f": {nb}" if nb else "") + ")")
        if side == "above" and end == zone[1]:
            nb = _neighbour_above(p["tensor"], evidence, zone[1], t["ptr"])
            return (f"at the last byte of {zname} (the range may go on above it, in writable "
                    "memory that memcheck does not check" + (f": {nb}" if nb else "") + ")")
        dist = (zone[1] - addr) if p["where"] == "red zone below" else (end - zone[0])
        return f"in {zname}, {dist} bytes from {p['tensor']}"
    near = (rec or {}).get("nearest") or {}
    if near.get("direction") == "inside":  # a read-only region (block) beyond a tensor's bytes
        owner = next((t["name"] for t in layout if t["ptr"] == near["base"] or
                      (t.get("redzone") or {}).get("base") == near["base"]), None)
        return (f"in the read-only allocation at {hex(near['base'])} of {near['size']:,} bytes"
                + (f" (the block of {owner}, past its bytes)" if owner else ""))
    if rec is not None and (rec.get("permission") == "out of bounds" or
                            (rec.get("nearest") or {}).get("direction") in ("before", "after")):
        return _oob(rec)
    return "outside the watched memory and its red zones"


def extent(launch: dict, layout: list[dict], evidence: dict | None = None,
           cut: bool = False) -> dict:
    """The range of one launch's faulting accesses relative to the watched tensors (module
    docstring): ``{"kind", "tensor", "direction", "covered", "tensor_nbytes", "lo", "hi",
    "n_accesses", "sizes", "gaps", "at_least", "sentence"}``. ``cut``: memcheck stopped the
    kernel after these accesses (its launch failed), so the range seen is a lower bound."""
    ex = _extent(launch, layout, evidence)
    extra = []
    if ex["kind"] != "inside" and not _is_marker(ex.get("tensor")):
        # the range covers no marker: the nearest one beyond the end the range runs out at
        sides = {"above": ["above"], "below": ["below"]}.get(ex.get("direction") or "",
                                                             ["above", "below"])
        for side in sides:
            t = toward(ex["lo"], ex["hi"], layout, side)
            if t:
                extra.append(t)
                break
    pa = points_at(launch["records"], layout)
    if pa and not any(_is_marker(n) for n in ex.get("covers", [])):
        extra.append(pa)
    if cut and ex["kind"] != "inside":
        extra.append(f"memcheck stopped the kernel after these {ex['n_accesses']} faulting "
                     "accesses (the launch failed), so the write covers at least these "
                     f"{ex['hi'] - ex['lo']} bytes and may go on past either end")
    if extra:
        ex["sentence"] += "; " + "; ".join(extra)
    ex["at_least"] = cut
    return ex


def _extent(launch: dict, layout: list[dict], evidence: dict | None) -> dict:
    acc = launch["accesses"]
    ivs = _union([(a, a + s) for a, s in acc])
    lo, hi = ivs[0][0], ivs[-1][1]
    gaps = sum(b[0] - a[1] for a, b in zip(ivs, ivs[1:]))
    rec_at = {r["address"]: r for r in launch["records"]}
    hi_addr = max(a for a, s in acc if a + s == hi)
    lo_rec, hi_rec = rec_at.get(lo), rec_at.get(hi_addr)
    base = {"lo": lo, "hi": hi, "lo_hex": hex(lo), "hi_hex": hex(hi),
            "n_accesses": len(acc), "sizes": sorted({s for _, s in acc}), "gaps": gaps,
            "kernel": launch.get("kernel")}
    inside = {t["name"]: _covered(ivs, t["ptr"], t["ptr"] + t["nbytes"]) for t in layout}
    inside = {n: c for n, c in inside.items() if c}
    span = (f"{len(acc)} faulting access{'es' if len(acc) != 1 else ''} "
            f"({'/'.join(str(s) for s in base['sizes'])} bytes each) over {hi - lo} bytes"
            + (f", {gaps} bytes between them not reported" if gaps else ""))
    base["covers"] = list(inside)
    if inside:
        covered = [t for t in layout if t["name"] in inside]
        # the tensor run into: the first covered one that the range reaches from below; else
        # the one it starts in (a range that starts inside a tensor and runs out above it)
        x = next((t for t in covered if lo < t["ptr"]), covered[0])
        xlo, xhi = x["ptr"], x["ptr"] + x["nbytes"]
        n = inside[x["name"]]
        first, last = max(lo, xlo) - xlo, min(hi, xhi) - xlo - 1
        others = [f"{t['name']} ({inside[t['name']]} bytes)" for t in covered
                  if t is not x and not (t["ptr"] <= lo < t["ptr"] + t["nbytes"])]
        also = f"; it also writes into {', '.join(others)}" if others else ""
        if lo >= xlo and hi <= xhi:
            return {**base, "kind": "inside", "tensor": x["name"], "direction": None,
                    "covered": n, "tensor_nbytes": x["nbytes"],
                    "sentence": (f"inside {x['name']}: bytes {first}-{last} of {x['nbytes']}, "
                                 f"every faulting access inside it ({span})")}
        below, above = lo < xlo, hi > xhi
        whole = "all" if n == x["nbytes"] else f"bytes {first}-{last} of"
        lo_at = _far_end(lo, lo, lo_rec, layout, "below", evidence)
        hi_at = _far_end(hi_addr, hi, hi_rec, layout, "above", evidence)
        if below and above:
            direction = "both sides"
            text = (f"runs across {x['name']} (all {x['nbytes']} bytes): its lowest access "
                    f"{lo_at}, its highest {hi_at}")
        elif below:
            direction = "below"
            text = (f"runs {n} bytes into {x['name']} from below ({whole} {x['nbytes']} "
                    f"bytes), starting {lo_at}")
        elif not _is_marker(x["name"]):
            # starts inside a tensor that is not a marker (a canary) and runs on above it: the
            # addresses say where the range lies, not that it came from above
            direction = "above"
            text = (f"starts in {x['name']} (its byte {first} of {x['nbytes']}; {n} bytes of "
                    f"it) and runs on above it, its highest access {hi_at}")
        else:
            direction = "above"
            text = (f"runs {n} bytes into {x['name']} from above ({whole} {x['nbytes']} "
                    f"bytes), starting {hi_at}")
        return {**base, "kind": "overrun", "tensor": x["name"], "direction": direction,
                "covered": n, "tensor_nbytes": x["nbytes"],
                "sentence": f"{text}{also} ({span})"}
    zoned = [place(a, layout) for a, _ in acc]
    zone = next((z for z in zoned if z["where"].startswith("red zone")), None)
    if zone is not None:
        t = next(t for t in layout if t["name"] == zone["tensor"])
        if zone["where"] == "red zone below":
            short, frm = t["ptr"] - hi, "from below"
            start = _far_end(lo, lo, lo_rec, layout, "below", evidence)
        else:
            short, frm = lo - (t["ptr"] + t["nbytes"]), "from above"
            start = _far_end(hi_addr, hi, hi_rec, layout, "above", evidence)
        return {**base, "kind": "red zone", "tensor": t["name"],
                "direction": zone["where"].split()[-1], "covered": 0,
                "tensor_nbytes": t["nbytes"],
                "sentence": (f"runs into the {zone['where']} {t['name']} {frm}, up to "
                             f"{short} bytes short of it (no faulting access reached the "
                             f"marker itself), starting {start} ({span})")}
    return {**base, "kind": "outside", "tensor": None, "direction": None, "covered": 0,
            "tensor_nbytes": None,
            "sentence": f"no access in watched memory or a red zone ({span})"}


def first_extent(parsed: dict, layout: list[dict], evidence: dict | None = None) -> dict | None:
    """The extent of the first launch with an access in watched memory or a red zone (None:
    no such launch)."""
    lns = launches(parsed.get("errors") or [])
    for i, ln in enumerate(lns):
        if any(place(a, layout)["where"] != "elsewhere" for a, _ in ln["accesses"]) or \
                points_at(ln["records"], layout):
            # the log's last faulting launch, after which the launch failed: memcheck stopped
            # that kernel, so its accesses are the ones it made before (a lower bound)
            cut = i == len(lns) - 1 and bool(parsed.get("launch_failed"))
            ex = extent(ln, layout, evidence, cut=cut)
            summ = parsed.get("error_summary")
            # the launch failure is one of the errors memcheck counts
            printed = len(parsed.get("errors") or []) + int(bool(parsed.get("launch_failed")))
            if summ is not None and printed < summ:
                ex["sentence"] += (f"; memcheck counted {summ} errors and printed "
                                   f"{printed} (--print-limit): the range may be wider")
            return ex
    return None
