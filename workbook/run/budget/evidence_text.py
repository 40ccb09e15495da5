"""The budget stage rules' evidence in sentences: each says what the values show, no more.

``cache_saw(st)``: the marker cache entering ``apply`` against the committed history — which
cached value (``last_start`` / ``last_end`` / ``scan_pos``) disagrees with the history and how,
and the reasoning state the cache gives replayed over it; ``mapping_saw(st)``: which mapping the
call or the kernel got sent the request's rows to which slot (``mapping_slots``);
``history_saw(st)``: the device's history view against the committed one;
``reasoning_state(truth)``: the history's reasoning state as a clause; ``marker_write(st)``:
whether the marker ids were written in band (a tracked PyTorch write) or not, and its evidence;
``in_batch(st)``: the request's place in its batch.

Every slot is said (``workbook.run.verdicts.say``): never None, NaN or a Python repr
(``tests/test_sentences.py`` renders each over the values the evidence can take). Not here:
which stage broke its contract (``workbook.run.budget.stages``), the trace-wide checks
(``workbook.run.budget.diagnose``).
"""

from __future__ import annotations

from workbook.run.verdicts import say


def mapping_saw(st: dict) -> str:
    """Which mapping sent the request's rows to which slot, against the slot the host
    registered it at (``req_id_to_index``), and what the kernel then did with its rows: from
    the tracer's record of every mapping the call and the kernel got (``mapping_slots``); for a
    trace without it, what the batch's ``idx_mapping`` said and that another mapping
    disagreed. One clause with its verb, the consequence the evidence shows after the colon."""
    own, bs = st.get("slot"), st.get("batch_slot")
    ms = st.get("mapping_slots") if isinstance(st.get("mapping_slots"), dict) else {}
    rows = [int(r) for r in ms.get("rows") or []]
    elsewhere = []  # (who, [(row, slot)] or None, slot)
    if bs is not None and own is not None and int(bs) != int(own):
        elsewhere.append(("the batch's idx_mapping", None, int(bs)))
    for who, key in (("expanded_idx_mapping (as apply_sampling_params got it)", "expanded"),
                     ("the kernel's own row mapping", "kernel_rows")):
        off = [(r, int(x)) for r, x in zip(rows, ms.get(key) or [])
               if own is None or int(x) != int(own)]
        if off:
            elsewhere.append((who, off, None))
    for who, key in (("the device copy of idx_mapping", "idx_dev"),
                     ("the per-request gate", "gate"), ("the marker-scan kernel", "kernel_req")):
        x = ms.get(key)
        if x is not None and (own is None or int(x) != int(own)):
            elsewhere.append((who, None, int(x)))
    missing = []
    if ms.get("kernel_n") is not None and ms.get("n") is not None and \
            int(ms["kernel_n"]) != int(ms["n"]):
        missing.append(f"the kernel's own row mapping held {ms['kernel_n']} of the batch's "
                       f"{ms['n']} rows")
    if ms.get("index_moved"):
        missing.append("req_id_to_index stopped naming the slot the request was registered at")
    said = _sent(elsewhere) + missing
    registered = f"the host registered the request at slot {say(own)} (req_id_to_index)"
    if elsewhere:
        then = "the kernel read another slot's state for this request's rows"
    elif missing:
        then = "the kernel did not process this request's rows at its own slot"
    elif ms:  # every recorded slot is its own: a mapping held no entry for the request
        said = [f"a mapping the call or the kernel got (the device copy of idx_mapping or the "
                "kernel's per-request slots) held no entry for this request"]
        then = "the kernel did not process this request's rows at its own slot"
    else:
        kept = (f"the batch's idx_mapping named its slot {bs}" if bs is not None
                else "the batch's idx_mapping was not recorded")
        said = [f"{kept}, yet a mapping the call or the kernel got (expanded_idx_mapping, the "
                "gate's slots or the kernel's own) did not name the request's slot (this trace "
                "does not record which slot it named)"]
        then = "the kernel did not read this request's own slot for its rows"
    return f"{'; '.join(said)}, while {registered}: {then}"


def _sent(elsewhere: list) -> list[str]:
    """Each mapping that named another slot, in a clause; all in one when they agree."""
    if not elsewhere:
        return []
    slots = {x for _w, off, x in elsewhere if x is not None} | {
        s for _w, off, _x in elsewhere for _r, s in (off or [])}
    if len(slots) == 1 and len(elsewhere) > 1:
        whos = [w for w, _o, _x in elsewhere]
        rows = sorted({r for _w, off, _x in elsewhere for r, _s in (off or [])})
        what = f"its row{'s' if len(rows) != 1 else ''} {say(rows)}" if rows else "it"
        return [f"{', '.join(whos[:-1])} and {whos[-1]} all sent {what} to slot "
                f"{next(iter(slots))}"]
    return [f"{w} sent {_rows(off)}" if off else f"{w} named slot {x}"
            for w, off, x in elsewhere]


def _rows(pairs: list[tuple[int, int]]) -> str:
    """``[(row, slot)]`` -> "row 4 to slot 2, row 5 to slot 2"."""
    return ", ".join(f"row {r} to slot {x}" for r, x in pairs)


def in_batch(st: dict) -> str:
    size, pos = st.get("batch_size"), st.get("batch_pos")
    return (f"batch of {say(size, 'an unrecorded size')}, request at position "
            f"{say(pos, 'not recorded')}")


def marker_write(st: dict) -> tuple[str, str]:
    """In band or out of band? A PyTorch write moves the tensor's ``_version`` (or replaces
    the tensor: storage moved); a write PyTorch does not track (another kernel, a raw or
    untracked alias) leaves both. The reference is the tracer's baseline, taken before the
    first request of the trace was added (``markers_version0``, values ``markers_base_ok``);
    without one, vLLM's own: the tensors are made once (``torch.tensor``: ``_version`` 0) and
    never written by vLLM."""
    ver, ver0 = st.get("markers_version"), st.get("markers_version0")
    moved, base_ok = st.get("markers_moved"), st.get("markers_base_ok")
    known = ver is not None and all(v is not None for v in ver)
    known0 = ver0 is not None and all(v is not None for v in ver0)
    if moved:
        return "H-i-inband", ("storage moved (the tensors were replaced): a PyTorch write "
                              "changed them (in band)")
    if known and known0 and list(ver) != list(ver0):
        return "H-i-inband", (f"storage unchanged and _version went from {say(ver0)} to "
                              f"{say(ver)} during the trace: a PyTorch write changed them (in "
                              "band)")
    if known and (base_ok is False or not known0) and any(int(v) != 0 for v in ver):
        return "H-i-inband", (f"storage unchanged and _version held {say(ver)} (the tensors are "
                              "made at "
                              "_version 0 and vLLM never writes them): a PyTorch write "
                              "changed them (in band)" + (", before this trace began"
                                                          if base_ok is False else ""))
    if known:
        return "H-i", (f"storage unchanged and _version stayed at {say(ver)} — no tracked "
                       "PyTorch write put "
                       "them there (an out-of-band write, or one through an untracked alias)")
    return "H-i", ("storage unchanged and _version is not tracked (inference tensors): no tracked "
                   "PyTorch write is recorded, in band or out of band cannot be told")


def history_saw(st: dict) -> str:
    """What the device's history view held against the committed history."""
    dev, host = st.get("total_len_dev"), st.get("total_len_before")
    if dev is not None and host is not None and int(dev) != int(host):
        return (f"the device held total_len={dev} for a committed history of {host} tokens")
    return (f"the device held total_len={say(dev)} for a committed history of "
            f"{say(host, 'an unrecorded number of')} tokens, and its tokens differ from the "
            "committed ones (checksum mismatch)")


def reasoning_state(truth) -> str:
    """The committed history's reasoning state (``budget.last_start``) as a clause."""
    if truth is None:
        return "the history's reasoning state was not recorded"
    if int(truth) < 0:
        return "the committed history is not in reasoning"
    return f"the history's reasoning opened at its start marker at position {truth}"


def cache_saw(st: dict) -> str:
    """The marker cache entering ``apply`` against the committed history: which cached value
    (``last_start`` / ``last_end`` / ``scan_pos``) disagrees with the history and how, then
    the reasoning state the cache gives when replayed over the history (``cache_ref_start``)
    against the history's own (``truth_start``). Says only what these values show: a start
    marker is "not cached" only where the cache holds no start at the history's."""
    n, truth, ref = st.get("total_len_before"), st.get("truth_start"), st.get("cache_ref_start")
    ls, le, sp = st.get("last_start_before"), st.get("last_end_before"), st.get("scan_pos_before")
    held = f"last_start={say(ls)}, last_end={say(le)}, scan_pos={say(sp)}"
    hist = (f"a committed history of {n} tokens" if n is not None else
            "a committed history of an unrecorded length")
    facts = []
    for what, v in (("start", ls), ("end", le)):
        if v is not None and n is not None and int(v) >= int(n):
            facts.append(f"the cached {what} position {v} is past the committed history's "
                         f"length {n}")
    if sp is not None and n is not None and int(sp) > int(n):
        facts.append(f"the cached scan position {sp} is past the committed history's length "
                     f"{n}")
    inside = n is None or ls is None or int(ls) < int(n)
    if truth is not None and int(truth) >= 0 and ls is not None:
        if int(ls) == int(truth):
            facts.append(f"the cached start position {ls} is the history's start marker")
        elif int(ls) < 0:
            facts.append(f"the cache holds no start position although the history's start "
                         f"marker is at {truth}")
        elif inside:
            facts.append(f"the cached start position {ls} is not the history's start marker "
                         f"at {truth}")
        if le is not None and int(truth) < int(le) and (n is None or int(le) < int(n)):
            facts.append(f"the cached end position {le} lies after the start marker at "
                         f"{truth}, where the committed history has no end marker")
    elif truth is not None and int(truth) < 0 and ls is not None and int(ls) >= 0 and \
            inside and (le is None or int(le) < int(ls)):
        facts.append(f"the cached start position {ls} has no cached end after it, while the "
                     "committed history is not in reasoning")
    if ref is None:
        gives = "the cache's reasoning state after the replay was not recorded"
    elif int(ref) < 0:
        gives = "replayed over the history, the cache says not in reasoning"
    else:
        gives = f"replayed over the history, the cache says in reasoning since position {ref}"
        if truth is not None and 0 <= int(truth) < int(ref) and n is not None and \
                int(ref) < int(n):
            gives += (f", so the reasoning count restarts ({int(n) - int(ref) - 1} tokens "
                      f"instead of {int(n) - int(truth) - 1})")
    return (f"at step {st.get('step')} the marker cache entering apply held {held} for "
            f"{hist}, where {reasoning_state(truth)}: "
            + "; ".join(facts + [gives]))


def fmt(v) -> str:
    return "an unrecorded value" if v is None else f"{v:.3g}"


def bias_found(c) -> str:
    """What ``apply`` really did at the due column of the violating row, against the logit
    that won the row."""
    row, due = c.row, c.due_token
    before, after = row.get("due_logit_before_apply"), row.get("due_logit_after_apply")
    if before is None and due is not None and c.markers.end and due == c.markers.end[0]:
        before = row.get("end_logit_before_apply")
    top, top_v = row.get("sampled_top"), row.get("sampled_top_logit")
    if top is None:
        ids, vals = row.get("topk_ids_after") or [], row.get("topk_vals_after") or []
        top, top_v = (ids[0], vals[0]) if ids and vals else (None, None)
    won = f"; token {top} won the row at {fmt(top_v)}" if top is not None else ""
    if before is None or after is None:
        return f"was not forced at the due column {say(due)} (left at {fmt(after)}){won}"
    delta = after - before
    if delta > 0:
        return (f"got +{fmt(delta)} at the due column {say(due)} ({fmt(before)} -> "
                f"{fmt(after)}), not +1e9, which was too weak against the winning logit"
                + (f" {fmt(top_v)} of token {top}" if top is not None else ""))
    return (f"got no bias at the due column {say(due)} (it stayed at {fmt(after)}) and +1e9 "
            f"in no column{won}")


PUSH_TOL = 1e-3  # a rise of the end column above this (relative to 1 + |value|) is a push


def end_push(row: dict) -> tuple[str, float, float] | None:
    """Whether a stage raised the end column of this row, from the trace's end column after
    each stage (raw -> before the budget's apply -> after it): ``("earlier", raw, before)``
    for a processor before the budget's apply, ``("apply", before, after)`` for the budget's
    own apply (any size of push); None when neither raised it."""
    raw, before, after = (row.get(k) for k in ("end_logit_raw", "end_logit_before_apply",
                                                "end_logit_after_apply"))
    up = lambda a, b: a is not None and b is not None and b - a > PUSH_TOL * (1 + abs(a))
    if up(raw, before):
        return "earlier", float(raw), float(before)
    if up(before, after):
        return "apply", float(before), float(after)
    if before is None and up(raw, after):
        return "apply", float(raw), float(after)
    return None


GUARD_KEEPS = ("the guard does not take it back: it takes back only an end that the budget's "
               "own apply raised to at least 1e8 where none was due")
