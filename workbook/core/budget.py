"""The budget rule: when must the end string come, and was it there? Pure Python, written once.

What vLLM promises its users (the contract; never what its kernel happens to do):

- ``docs/features/reasoning_outputs.md`` ("Thinking Budget Control", vLLM 0.28-0.32): "Token
  counting starts from `reasoning_start_str`. Once the reasoning token count reaches the
  configured `thinking_token_budget`, vLLM forces the model to produce `reasoning_end_str`,
  effectively terminating the reasoning block." and "`reasoning_end_str` can include a
  transition phrase before the reasoning end token. For example, setting `reasoning_end_str`
  to "I have to give the solution based on the reasoning directly now.</think>" instructs the
  model to emit that phrase when the budget is exhausted".
- ``vllm.config.ReasoningConfig``: "Set `reasoning_start_str` and `reasoning_end_str` to the
  strings used to enter and forcibly terminate reasoning. The end string may include a
  transition phrase before the parser's natural reasoning end marker."; ``reasoning_end_str``:
  "String forced when the thinking budget is exhausted."; the token ids are "derived from"
  the strings (``tokenizer.encode(s, add_special_tokens=False)``), the natural end is the
  parser's end marker ("Token IDs that indicate the model naturally ended reasoning").

Restated as the rule, on token ids (``Markers``: ``start``, ``end`` = the forced end string,
``natural_end`` = the parser's marker, ``end`` when there is none):

- A history is *in reasoning* after its last start marker, until the model writes the natural
  end marker itself or the forced end string is complete. Its reasoning count is the number of
  tokens after that start marker (the marker's own tokens are not counted, however many).
- The budget binds at the first OUTPUT position whose count reaches the budget (the prompt's
  tokens are given, never forced: a prompt already over the budget binds at output index 0).
  From there the end string is due, token by token, in order, so that it appears exactly once:
  where the reasoning text before the binding position already ends with a proper prefix of
  ``end`` (``begun``: a resumed prompt, the chat template's ``"\n"`` after ``<think>``, or the
  model's own tokens), the forced tokens continue it — ``end[k]`` at the binding position for
  a prefix of ``k`` tokens, ``end[k + i]`` at the i-th position after it — and never restart
  it (vLLM 0.34.0's ``test_v2_thinking_budget_continues_end_prefix_from_prompt``: "A resumed
  prompt ending with a partial forced-end marker must not restart the marker sequence and
  duplicate its first token"; ``thinking_budget.py``: "If the tail already ends with a prefix
  of the forced end sequence (even from a resumed prompt), continue from the next marker
  token"). Otherwise ``end[0]`` comes at the binding position; the whole string is due even
  where a prefix of ``end`` already holds the natural end marker (``"</think>\n\n"``: the
  ``"\n\n"`` after ``</think>`` is forced too). After a token that is not the one due (the
  budget not honored there), what is due next is again the continuation of the prefix the
  text then ends with.
- Once the whole end string is emitted reasoning is over: nothing more is forced (a forced end
  string that does not contain the natural end marker still ends it: "effectively terminating
  the reasoning block"). A natural end the model writes before the binding position ends
  enforcement; counting stops at the natural end or at the end of the forced string.

So, for a prompt whose count is ``r0`` and a budget ``b``, the forced tokens must start at
output index ``max(0, b - r0)`` (``end[begun:]``, ``begun`` the prefix the reasoning text held
there; 0 mostly) — unless the output ended reasoning by itself before, or ended before the rest
of the string could be there (then the budget could not bind: the verdict is ``None``).

The contract has a second side: the budget forces the end string ONLY where it binds. An end
marker the model writes itself before that is legal (a natural end); one that was *forced*
there is not. Where the caller knows which output positions were forced (the trace sees the
forcing bias, or a token replaced after sampling: ``forced``), each forced position must be
one where the rule makes the end due (``row_truth``); the first that is not is a violation of
its kind (``Judgement.kind``): ``early`` (forced before the budget binds), ``unbudgeted``
(forced into a request without a budget), ``twice`` (forced after reasoning had ended,
naturally or by the whole forced string). The other kind, ``missing``, is the first side: the
end string is not at the index where it is due.

vLLM's kernel (``vllm/v1/worker/gpu/sample/thinking_budget.py``, 0.28-0.34) forces ``end[p]``
with ``p`` the longest proper prefix of ``end`` the history ends with, while the last start
lies after the last natural end: ``forced_token`` below is that choice, kept as the guard's
twin of vLLM (``workbook.hooks.guard``); both it and the rule take the prefix from ``begun``.
Where the kernel differs from the promise — a forced string with tokens after the natural end,
a forced string without the natural end — is a finding (``docs/reasoning-config.md``); a
prefix the text already holds is not (the rule above: vLLM's own tests state it).

Used by the client-side verdict (``workbook.run.request``), the trace diagnosis
(``workbook.run.budget.diagnose``), the tracer's own host-side count (``workbook.hooks.observe.tracer``) and the
guard's host side (``workbook.hooks.guard``); the guard's Triton kernel is tested against it on
random histories (``tests/test_budget.py``, ``tests/test_guard.py``).

Deliberately not here: anything that reads vLLM or torch objects (``Markers.of`` only reads
three attributes of whatever it is given).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

KEYS = {"start": "reasoning_start_token_ids", "end": "reasoning_end_token_ids",
        "natural_end": "natural_reasoning_end_token_ids"}
FORCED_LOGIT = 1e8  # a logit at or above this was set by the budget's forcing bias (+1e9)


@dataclass(frozen=True)
class Markers:
    """The reasoning marker ids. ``natural_end`` falls back to ``end`` when empty."""

    start: tuple[int, ...] = ()
    end: tuple[int, ...] = ()
    natural_end: tuple[int, ...] = field(default=())

    def __post_init__(self):
        object.__setattr__(self, "start", tuple(int(t) for t in self.start))
        object.__setattr__(self, "end", tuple(int(t) for t in self.end))
        object.__setattr__(self, "natural_end",
                           tuple(int(t) for t in self.natural_end) or self.end)

    @classmethod
    def of(cls, source: Any) -> "Markers":
        """From vLLM's ``reasoning_config`` (attributes), an effective-configuration dict
        (``reasoning_*_token_ids`` keys), a trace's ``{"start", "end", "natural_end"}`` dict,
        or another ``Markers``. Missing values are empty."""
        if source is None:
            return cls()
        if isinstance(source, Markers):
            return source
        if isinstance(source, dict):
            if any(k in source for k in ("start", "end", "natural_end")):
                get = source.get
                return cls(get("start") or (), get("end") or (), get("natural_end") or ())
            return cls(*(source.get(KEYS[k]) or () for k in ("start", "end", "natural_end")))
        return cls(*(getattr(source, KEYS[k], None) or () for k in ("start", "end",
                                                                      "natural_end")))

    @property
    def complete(self) -> bool:
        """Both start and end known: a budget can be enforced and judged."""
        return bool(self.start and self.end)

    def to_dict(self) -> dict[str, list[int]]:
        return {k: list(v) for k, v in asdict(self).items()}

    def to_effective(self) -> dict[str, list[int]]:
        return {KEYS[k]: list(v) for k, v in asdict(self).items()}


def budget_param(value: Any) -> int | None:
    """A ``thinking_token_budget`` value as vLLM's ``SamplingParams`` takes it
    (``validate_thinking_token_budget``, vLLM 0.32.0 and 0.34.0; its tests
    ``tests/v1/sample/test_thinking_token_budget_params.py``): ``None`` and ``-1`` mean no
    budget (``None``); a non-negative ``int`` is the budget (one beyond any reasoning length,
    ``2**40``, simply never binds); anything else — another negative, a ``float`` (even
    ``10.0``), a ``bool`` — is refused: ``ValueError`` with vLLM's words."""
    if value is None:
        return None
    if isinstance(value, (bool, float)) or not isinstance(value, int) or value < -1:
        raise ValueError(f"must be a non-negative integer or -1 for unlimited, got {value!r}")
    return None if value == -1 else int(value)


def first_index_of(seq: Sequence[int], sub: Sequence[int]) -> int:
    """Start of the first occurrence of ``sub`` in ``seq``, or -1 (-1 for an empty ``sub``)."""
    n = len(sub)
    if n == 0:
        return -1
    sub = list(sub)
    for i in range(0, len(seq) - n + 1):
        if seq[i] == sub[0] and list(seq[i:i + n]) == sub:
            return i
    return -1


def last_index_of(seq: Sequence[int], sub: Sequence[int], start: int = 0) -> int:
    """Start of the last occurrence of ``sub`` at index >= ``start``, or -1."""
    n = len(sub)
    if n == 0:
        return -1
    sub = list(sub)
    for i in range(len(seq) - n, start - 1, -1):
        if seq[i] == sub[0] and list(seq[i:i + n]) == sub:
            return i
    return -1


def begun(text: Sequence[int], end: Sequence[int]) -> int:
    """How many tokens of the forced end string ``text`` already ends with: the length of the
    longest PROPER prefix of ``end`` that is a suffix of ``text`` (0: none). The rule continues
    the string from ``end[begun]`` (``row_truth``); vLLM's kernel makes the same choice
    (``forced_token``). ``text``: the reasoning text before the row (after the start marker)."""
    end = list(end)
    k = 0
    for pl in range(1, min(len(end), len(text) + 1)):
        if [int(t) for t in text[len(text) - pl:]] == end[:pl]:
            k = pl
    return k


def reasoning_count(history: Sequence[int], markers: Markers) -> int | None:
    """Reasoning tokens at the end of ``history``; ``None`` when it is not in reasoning."""
    s = last_index_of(history, markers.start)
    if s < 0:
        return None
    if last_index_of(history, markers.natural_end, start=s) >= 0:  # last_start <= last_end
        return None
    return len(history) - (s + len(markers.start))


def expected_end_index(prompt: Sequence[int], output: Sequence[int], budget: int | None,
                       markers: Markers) -> int | None:
    """Output index where the end marker must begin; ``None`` if the budget never binds."""
    return expected_from_count(reasoning_count(prompt, markers) if markers.complete else None,
                               output, budget, markers)


def expected_from_count(r0: int | None, output: Sequence[int], budget: int | None,
                        markers: Markers, forced: Sequence[int] = ()) -> int | None:
    """``expected_end_index`` for a prompt whose reasoning count is ``r0`` (None: not in
    reasoning) — what a trace knows without the whole prompt. A natural end that was forced
    (it covers an index of ``forced``) is not the model's own and does not end enforcement."""
    if budget is None or budget < 0 or r0 is None or not markers.complete:
        return None
    idx = max(0, int(budget) - int(r0))
    natural = _own_natural_end(output, markers, forced)
    if 0 <= natural < idx:
        return None  # reasoning ended by itself before the budget bound
    return idx


def _own_natural_end(output: Sequence[int], markers: Markers, forced: Sequence[int]) -> int:
    """First index where the model itself wrote the natural end marker (no forced token in
    it); -1 when it never did."""
    ne, bad = list(markers.natural_end), set(int(f) for f in forced)
    n = len(ne)
    if n == 0:
        return -1
    for i in range(0, len(output) - n + 1):
        if list(output[i:i + n]) == ne and not bad.intersection(range(i, i + n)):
            return i
    return -1


VIOLATION_KINDS = {
    "missing": "the end marker is not where the budget binds",
    "early": "the end marker was forced before the budget binds",
    "unbudgeted": "the end marker was forced into a request without a budget",
    "twice": "the end marker was forced again, after reasoning had already ended",
}


@dataclass(frozen=True)
class Judgement:
    expected_end_index: int | None  # where the end marker must begin (None: never binds)
    actual_end_index: int  # where it first begins in the output (-1: nowhere)
    honored: bool | None  # None: the budget could not bind within the output
    kind: str | None = None  # why it is violated (VIOLATION_KINDS); None unless violated
    at: int | None = None  # output index of the first violation (None unless violated)
    begun: int = 0  # end tokens the reasoning text already held where the budget bound: the
    # forced tokens due from expected_end_index are end[begun:] (``begun``)

    @property
    def verdict(self) -> str:
        return {True: "honored", False: "violated", None: "inconclusive"}[self.honored]


def judge(prompt: Sequence[int], output: Sequence[int], budget: int | None,
          markers: Markers, forced: Sequence[int] = ()) -> Judgement:
    """Was the budget honored by ``output``? The one verdict rule of the workbook.

    ``None`` when the budget does not bind, or when the output stopped (length limit, end of
    sequence, stop string) before the end marker could be complete at the expected index —
    unless a ``forced`` output index was not due (then violated, whatever the rest).
    """
    markers = Markers.of(markers)
    return judge_from_count(reasoning_count(prompt, markers) if markers.complete else None,
                            output, budget, markers, forced, tail=prompt)


def judge_from_count(r0: int | None, output: Sequence[int], budget: int | None,
                     markers: Markers, forced: Sequence[int] = (),
                     tail: Sequence[int] = ()) -> Judgement:
    """``judge`` for a prompt whose reasoning count is ``r0``. ``forced``: output indices
    whose token was forced (known to a trace only); each must be due (``forced_not_due``).
    ``tail``: the prompt's last tokens, as many as known (the end string the prompt already
    began is continued, ``begun``; unknown: none begun in the prompt)."""
    markers = Markers.of(markers)
    budget = None if budget is None else int(budget)
    exp = expected_from_count(r0, output, budget, markers, forced)
    act = first_index_of(output, markers.end)
    bad = forced_not_due(r0, output, budget, markers, forced, tail)
    k = 0 if exp is None else begun(_reasoning_text(r0, tail, output[:exp]), markers.end)
    rest = list(markers.end)[k:]
    if exp is None or exp + len(rest) > len(output):
        honored, at = None, None
    else:
        honored = list(output[exp:exp + len(rest)]) == rest
        at = None if honored else exp
        if honored and k and (act < 0 or act > exp):
            act = exp  # the string completed by continuing the begun prefix
    if bad is not None and (at is None or bad[0] < at):
        return Judgement(exp, act, False, bad[1], bad[0], k)
    return Judgement(exp, act, honored, None if honored is not False else "missing", at, k)


def _reasoning_text(r0: int | None, tail: Sequence[int], output: Sequence[int]) -> list[int]:
    """The reasoning text before an output position: the prompt's last ``r0`` tokens as far as
    ``tail`` holds them, then ``output``."""
    n = 0 if r0 is None else min(int(r0), len(tail))
    return [int(t) for t in list(tail)[len(tail) - n:]] + [int(t) for t in output]


def forced_not_due(r0: int | None, output: Sequence[int], budget: int | None,
                   markers: Markers, forced: Sequence[int],
                   tail: Sequence[int] = ()) -> tuple[int, str] | None:
    """The first forced output index where the rule does not make the end due, and its kind
    (``early`` / ``unbudgeted`` / ``twice``); None when every forced index was due.

    The prompt is known here by its reasoning count and its ``tail`` only: it stands as
    ``start`` followed by ``r0`` tokens, the last of them the tail's (so a prefix of the end
    string the prompt began is continued) and the others tokens no marker can match (-1),
    which gives every later position the same count."""
    markers = Markers.of(markers)
    if not forced or not markers.end:
        return None
    known = _reasoning_text(r0, tail, ())
    head = (list(markers.start) + [-1] * (int(r0) - len(known)) + known) \
        if r0 is not None and markers.start else []
    has_budget = budget is not None and int(budget) >= 0
    for i in sorted(set(int(f) for f in forced if 0 <= int(f) < len(output))):
        hist = head + [int(t) for t in output[:i]]
        truth = row_truth(hist, [], 0, int(budget) if has_budget else None, markers,
                          prompt_len=len(head))
        if truth.due and int(output[i]) == truth.token:
            continue
        if not has_budget:
            return i, "unbudgeted"
        return i, "twice" if truth.ended in ("natural", "forced") else "early"
    return None


def overall(honored: Sequence[bool | None]) -> str:
    """A run's verdict over its requests: any violation wins, then any honored request."""
    flags = [h for h in honored if h is not None]
    return "violated" if False in flags else "honored" if flags else "inconclusive"


def forced_token(history: Sequence[int], markers: Markers) -> int:
    """vLLM's kernel's choice once the budget binds (``end[p]``, ``p`` the longest proper
    prefix of ``end`` the history ends with: ``begun`` over the whole history) — the guard
    mirrors vLLM with it. It agrees with the promise (``row_truth``) while reasoning lasts;
    they differ after the whole forced string was emitted (the rule forces nothing more)."""
    end = list(markers.end)
    return end[begun(history, end)]


# ---- per-row truth and the marker cache: what the budget stage must produce --------------
#
# The diagnosis judges each stage of MRV2 against these host-side truths, computed from the
# committed history alone (never from vLLM's device state).

def last_start(history: Sequence[int], markers: Markers) -> int:
    """Position of the start marker that opens the reasoning section at the end of
    ``history``; -1 when the history is not in reasoning (the rule's state, as a position)."""
    s = last_index_of(history, markers.start)
    if s < 0 or last_index_of(history, markers.natural_end, start=s) >= 0:
        return -1
    return s


@dataclass(frozen=True)
class RowTruth:
    count: int | None  # reasoning tokens before the row's token (None: not in reasoning)
    due: bool  # the budget binds at this row: the kernel must force it
    token: int | None  # the end-string token due at this row (None when not due)
    ended: str | None = None  # not in reasoning because: "natural" / "forced" (the whole end
    # string was emitted) / "none" (no start marker); None while in reasoning


def row_truth(history: Sequence[int], drafts: Sequence[int], local_pos: int,
              budget_value: int | None, markers: Markers, prompt_len: int = 0) -> RowTruth:
    """What the budget must do at logits row ``local_pos`` of a request whose committed
    history is ``history`` (its first ``prompt_len`` tokens the prompt) and whose drafts this
    step are ``drafts`` (row ``j`` sees the history plus drafts ``[:j]``): force ``token`` iff
    ``due`` — the promise of the module docstring, walked over the history."""
    markers = Markers.of(markers)
    h = [int(t) for t in history] + [int(t) for t in drafts[:local_pos]]
    if not markers.complete:
        return RowTruth(None, False, None, "none")
    st, ne, end = list(markers.start), list(markers.natural_end), list(markers.end)
    s = last_index_of(h, st)
    if s < 0:
        return RowTruth(None, False, None, "none")
    body = s + len(st)  # first reasoning token
    has_budget = budget_value is not None and int(budget_value) >= 0
    bind = max(body + int(budget_value), int(prompt_len)) if has_budget else len(h) + 1
    # the model's own natural end before the binding position ends reasoning
    nat = last_index_of(h[:bind], ne, start=s) if bind <= len(h) else last_index_of(h, ne,
                                                                                    start=s)
    if nat >= 0:
        return RowTruth(None, False, None, "natural")
    if len(h) < bind:
        return RowTruth(len(h) - body, False, None)
    # end tokens the string holds at the binding position: the prefix the reasoning text
    # already began (``begun``), continued, never restarted
    k = begun(h[body:bind], end)
    for i in range(bind, len(h)):
        if h[i] == end[k]:
            k += 1
            if k == len(end):
                return RowTruth(None, False, None, "forced")
            continue
        # not the forced token: the budget was not honored here; reasoning goes on unless the
        # model itself completed the natural end now
        if i + 1 >= len(ne) and h[i + 1 - len(ne):i + 1] == ne and i + 1 - len(ne) >= s:
            return RowTruth(None, False, None, "natural")
        k = begun(h[body:i + 1], end)
    return RowTruth(len(h) - body, True, end[k])


def scan_marker_cache(history: Sequence[int], scan_pos: int, last_start_pos: int,
                      last_end_pos: int, markers: Markers,
                      block: int = 1024) -> tuple[int, int, int]:
    """vLLM's marker-cache update (``_update_committed_marker_cache_kernel``, 0.28–0.32) on the
    host: from the cache ``(scan_pos, last_start, last_end)`` and the committed ``history``,
    the cache after the update ``(last_start, last_end, scan_pos)``. The reference a device
    cache is checked against: a right cache entering ``apply`` must come out of this update
    holding the rule's ``last_start``."""
    markers = Markers.of(markers)
    st, ne = list(markers.start), list(markers.natural_end)
    n = len(history)
    ls, le, sp = int(last_start_pos), int(last_end_pos), int(scan_pos)

    def at(i: int, sub: list) -> bool:
        return i + len(sub) <= n and list(history[i:i + len(sub)]) == sub

    if sp > n:
        sp, ls, le = 0, -1, -1
    if sp == 0 and ls < 0 and le < 0:  # cold scan, backwards by blocks
        hi = n
        while hi > 0 and ls < 0 and le < 0:
            lo = max(0, hi - block)
            ls = max([i for i in range(lo, hi) if at(i, st)], default=-1)
            le = max([i for i in range(lo, hi) if at(i, ne)], default=-1)
            hi = lo
    else:
        for i in range(max(sp, 0), n):
            if at(i, st):
                ls = i
            if at(i, ne):
                le = i
    return ls, le, max(0, n - (max(len(st), len(ne)) - 1))


def cache_start(last_start_pos: int, last_end_pos: int) -> int:
    """The reasoning state a marker cache encodes (vLLM: in reasoning iff
    ``last_start > last_end``), as ``last_start``'s position; -1 when not in reasoning."""
    return int(last_start_pos) if last_start_pos >= 0 and last_start_pos > last_end_pos else -1


def history_checksum(history: Sequence[int]) -> int:
    """Σ token·(position+1) over the history: the tracer computes the same sum on the device
    over ``all_token_ids[slot, :total_len]`` to prove the device history is the host's."""
    return int(sum(int(t) * (i + 1) for i, t in enumerate(history)))
