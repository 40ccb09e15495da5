"""Per-request sampling constraints as contracts: what a logits row and the emitted tokens must
satisfy. Pure Python, written once (the budget's own rule stays in ``workbook.core.budget``).

A request's constraint parameters (``Params``, read from vLLM's ``SamplingParams`` in the worker,
where the engine has added its EOS ids) and a row's position (``RowContext``: prompt, committed
output, this step's drafts, local position ``j`` — ``0`` the target row, ``j >= 1`` draft row
``j``) determine, for every column a contract names, the value the *processed* logits row must
hold, as a function of the raw value (``expected``). vLLM's processing order inside
``Sampler.apply_sampling_params`` (0.28–0.32, MRV2), restated:

    1. allowed_token_ids   every other column  -> -inf
    2. logit_bias          column c            -> raw + b[c]
    3. min_tokens          stop/EOS columns    -> -inf while the row's output index < min_tokens
    4. penalties           column c, count n(c) over output + drafts[:j], in_prompt(c):
                           repetition: x/r if x > 0 else x*r (when c is in prompt or output),
                           then - frequency * n(c) - presence * [n(c) > 0]
    5. bad_words           last token of a banned sequence whose prefix ends the output
                           (+ drafts[:j]) -> -inf (vLLM matches within the output only)
    6. thinking budget     the forced column (``budget.row_truth``) -> >= ``budget.FORCED_LOGIT``
    7. temperature         value / T when T is neither 0 (greedy) nor 1

and what the emitted tokens must satisfy (``check_output``): no stop/EOS before ``min_tokens``;
nothing past a stop token or past ``max_tokens`` (with accepted drafts); allowed ids only; no
banned sequence inside the output; the budget's ``</think>`` where ``budget.judge`` wants it;
each returned logprob equal to the log-softmax (or the logit, per ``logprobs_mode``) of the row
it came from; a JSON-schema constrained output that is a grammar-valid prefix — every token from
where vLLM starts the grammar (after the reasoning) accepted by it, judged on ``GrammarTruth``,
the evidence a caller builds with xgrammar (``workbook.vllm.grammar``) — and, finished by stop,
complete (the grammar at its end, the text JSON). ``unjudged`` names what could not be judged
(no token under the grammar, or no grammar evidence and no finished output).

Two contracts are host-side only (no logits column; the row check gathers nothing for them):
``stop_strings`` (``check_stop_strings``: once a stop string completes — one token at a time,
as without speculation, ``stop_string_end`` over the decoded prefixes the caller gives — the
returned tokens end at the token that completed it, nothing past it even when later tokens
were accepted drafts of the same step, and the text ends right before it, or after it with
``include_stop_str_in_output``) and ``prompt_logprobs`` (``check_prompt_logprobs``: every
prompt position holds the prompt's own token, each value is what the logits row that predicts
the position says, and that row's input token is the prompt's previous token;
``prompt_logprobs_divergence``: equal to the same request's without speculation, to
``RTOL``/``ATOL``, rank by rank, so a near tie's order is not a difference). ``unjudged_host``
says when neither could be checked (no stop string in the output; no prompt logprobs returned).

``validate(params, vocab_size)`` rejects, before an engine starts, what vLLM's ``SamplingParams``
would reject (naming the parameter). A refusal that depends on the speculative method (vLLM
0.32's ``_validate_spec_decode``: ``logit_bias`` / ``min_p`` with spec decoding) is deliberately
NOT predicted here: vLLM's own message is the result.

Deliberately not here: min_p, top-k/top-p (a row's surviving set is a rank property, not a
column property; ``Params`` refuses them), anything that reads vLLM, torch or xgrammar objects
(``Params.of`` only reads attributes), the evidence itself (``workbook.hooks.rowcheck``; the
grammar's: ``workbook.vllm.grammar``, its per-row check in ``workbook.run.constraints``),
structured outputs other than a JSON schema (regex, choice, grammar: ``Params`` keeps only
``json``), decoding text (the caller's tokenizer gives ``stop_string_end`` its prefixes).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Sequence

from workbook.core import budget

NEG_INF = float("-inf")
LOGPROBS_MODES = ("raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits")
MAX_LOGPROBS = 20  # vLLM's default ModelConfig.max_logprobs
CONSTRAINTS = ("thinking_token_budget", "min_tokens", "logit_bias", "allowed_token_ids",
               "bad_words", "penalties", "stop", "logprobs", "structured_output",
               "prompt_logprobs", "stop_strings")
RTOL, ATOL = 1e-4, 1e-5  # float32 arithmetic in vLLM's kernels vs this rule in float64


class ContractError(ValueError):
    """A constraint parameter vLLM would reject; names the parameter. Raised before any
    engine starts."""

    def __init__(self, parameter: str, message: str):
        super().__init__(f"{parameter}: {message}")
        self.parameter = parameter


@dataclass(frozen=True)
class Params:
    """The constraint parameters of one request (``SamplingParams``-like)."""

    max_tokens: int | None = 16
    min_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()
    eos_token_ids: tuple[int, ...] = ()  # the engine's EOS ids (masked by min_tokens always)
    ignore_eos: bool = False  # EOS does not stop the request (it is still masked by min_tokens)
    logit_bias: tuple[tuple[int, float], ...] = ()
    allowed_token_ids: tuple[int, ...] | None = None
    bad_words: tuple[tuple[int, ...], ...] = ()  # token id sequences
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    temperature: float = 0.0
    logprobs: int | None = None
    logprobs_mode: str = "raw_logprobs"
    thinking_token_budget: int | None = None
    json_schema: dict | None = None
    min_p: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    prompt_logprobs: int | None = None
    stop_strings: tuple[str, ...] = ()  # vLLM's ``stop`` (text, matched on the host)
    include_stop_str_in_output: bool = False

    def __post_init__(self):
        s = object.__setattr__
        s(self, "stop_strings", (self.stop_strings,) if isinstance(self.stop_strings, str)
          else tuple(self.stop_strings))
        s(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        s(self, "eos_token_ids", tuple(int(t) for t in self.eos_token_ids))
        lb = self.logit_bias.items() if isinstance(self.logit_bias, dict) else self.logit_bias
        s(self, "logit_bias", tuple((int(k), float(v)) for k, v in lb))
        if self.allowed_token_ids is not None:
            s(self, "allowed_token_ids", tuple(int(t) for t in self.allowed_token_ids))
        s(self, "bad_words", tuple(tuple(int(t) for t in w) for w in self.bad_words))

    @classmethod
    def of(cls, sp: Any, logprobs_mode: str = "raw_logprobs") -> "Params":
        """From vLLM's ``SamplingParams`` (attributes; as the worker holds them) or a dict of
        the same names (``bad_words`` there: token id lists)."""
        get = sp.get if isinstance(sp, dict) else lambda k, d=None: getattr(sp, k, d)
        stop = tuple(get("stop_token_ids") or ())
        all_stop = get("all_stop_token_ids")
        eos = tuple(sorted(set(all_stop) - set(stop))) if all_stop is not None \
            else tuple(get("eos_token_ids") or ())
        bad = get("bad_words_token_ids") if not isinstance(sp, dict) else get("bad_words")
        so = get("structured_outputs")
        schema = getattr(so, "json", None) if so is not None else get("json_schema")
        if isinstance(schema, str):
            schema = json.loads(schema)
        budget_v = get("thinking_token_budget")
        return cls(max_tokens=get("max_tokens"), min_tokens=int(get("min_tokens") or 0),
                   stop_token_ids=stop, eos_token_ids=eos,
                   ignore_eos=bool(get("ignore_eos") or False),
                   logit_bias=tuple((get("logit_bias") or {}).items()),
                   allowed_token_ids=get("allowed_token_ids") or None,
                   bad_words=tuple(bad or ()),
                   repetition_penalty=float(get("repetition_penalty", 1.0) or 1.0),
                   presence_penalty=float(get("presence_penalty") or 0.0),
                   frequency_penalty=float(get("frequency_penalty") or 0.0),
                   temperature=float(get("temperature") or 0.0),
                   logprobs=get("logprobs"), logprobs_mode=logprobs_mode,
                   thinking_token_budget=None if budget_v is None or budget_v < 0 else budget_v,
                   json_schema=schema, min_p=float(get("min_p") or 0.0),
                   top_k=int(get("top_k") or 0), top_p=float(get("top_p") or 1.0),
                   prompt_logprobs=get("prompt_logprobs"),
                   stop_strings=get("stop") or (),
                   include_stop_str_in_output=bool(get("include_stop_str_in_output") or False))

    # ---- which constraints a request carries -------------------------------------------------
    @property
    def penalised(self) -> bool:
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 \
            or self.frequency_penalty != 0.0

    def constraints(self) -> list[str]:
        """The contracts this request is judged by (``CONSTRAINTS`` names, in that order)."""
        on = {"thinking_token_budget": self.thinking_token_budget is not None,
              "min_tokens": self.min_tokens > 0, "logit_bias": bool(self.logit_bias),
              "allowed_token_ids": self.allowed_token_ids is not None,
              "bad_words": bool(self.bad_words), "penalties": self.penalised,
              "stop": bool(self.stop_token_ids) or (bool(self.eos_token_ids)
                                                    and not self.ignore_eos)
              or self.max_tokens is not None,
              "logprobs": self.logprobs is not None,
              "structured_output": self.json_schema is not None,
              "prompt_logprobs": self.prompt_logprobs is not None,
              "stop_strings": bool(self.stop_strings)}
        return [c for c in CONSTRAINTS if on[c]]

    @property
    def masked_by_min_tokens(self) -> frozenset[int]:
        """vLLM's ``all_stop_token_ids``: stop ids and EOS ids (EOS even with ignore_eos)."""
        return frozenset(self.stop_token_ids) | frozenset(self.eos_token_ids)

    @property
    def stopping_ids(self) -> frozenset[int]:
        """Tokens that end the request when emitted."""
        return frozenset(self.stop_token_ids) | (frozenset() if self.ignore_eos
                                                 else frozenset(self.eos_token_ids))

    def columns(self, markers: budget.Markers | None = None) -> list[int]:
        """The static columns the contracts name for every row of this request (penalties add
        the history's and the drafts' columns, which the evidence gathers on the device)."""
        cols: list[int] = []
        cols += [k for k, _ in self.logit_bias]
        cols += list(self.allowed_token_ids or ())
        if self.min_tokens > 0:
            cols += sorted(self.masked_by_min_tokens)
        cols += [w[-1] for w in self.bad_words if w]
        if self.thinking_token_budget is not None and markers is not None:
            cols += list(budget.Markers.of(markers).end)
        return list(dict.fromkeys(cols))


def validate(p: Params, vocab_size: int, max_logprobs: int = MAX_LOGPROBS) -> None:
    """Raise ``ContractError`` naming the parameter for what vLLM's ``SamplingParams`` would
    reject (vLLM 0.28–0.32 ``_verify_args`` and ``verify``), and for what this workbook's
    contracts cannot judge (min_p, top-k/top-p)."""
    def ids_in_vocab(name: str, ids: Iterable[int]) -> None:
        bad = [t for t in ids if not 0 <= int(t) < vocab_size]
        if bad:
            raise ContractError(name, f"token id(s) {bad} outside the vocabulary "
                                      f"[0, {vocab_size})")

    if p.max_tokens is not None and p.max_tokens < 1:
        raise ContractError("max_tokens", f"must be at least 1, got {p.max_tokens}")
    if p.min_tokens < 0:
        raise ContractError("min_tokens", f"must be >= 0, got {p.min_tokens}")
    if p.max_tokens is not None and p.min_tokens > p.max_tokens:
        raise ContractError("min_tokens", f"must be <= max_tokens={p.max_tokens}, "
                                          f"got {p.min_tokens}")
    for name in ("presence_penalty", "frequency_penalty"):
        v = getattr(p, name)
        if not -2.0 <= v <= 2.0:
            raise ContractError(name, f"must be in [-2, 2], got {v}")
    if not math.isfinite(p.repetition_penalty) or p.repetition_penalty <= 0.0:
        raise ContractError("repetition_penalty", f"must be a finite number > 0, "
                                                  f"got {p.repetition_penalty}")
    if not math.isfinite(p.temperature) or not 0.0 <= p.temperature <= 2.0:
        raise ContractError("temperature", f"must be in [0, 2], got {p.temperature}")
    if p.logprobs is not None:
        n = vocab_size if p.logprobs == -1 else p.logprobs
        if n < 0:
            raise ContractError("logprobs", f"must be non-negative or -1, got {p.logprobs}")
        if n > max_logprobs:
            raise ContractError("logprobs", f"{n} is greater than max allowed: {max_logprobs}")
    if p.prompt_logprobs is not None:
        n = vocab_size if p.prompt_logprobs == -1 else p.prompt_logprobs
        if n < 0:
            raise ContractError("prompt_logprobs", f"must be non-negative or -1, got "
                                                   f"{p.prompt_logprobs}")
        if n > max_logprobs:
            raise ContractError("prompt_logprobs", f"{n} is greater than max allowed: "
                                                   f"{max_logprobs}")
    if any(not isinstance(x, str) or not x for x in p.stop_strings):
        raise ContractError("stop", "cannot contain an empty string")
    if p.logprobs_mode not in LOGPROBS_MODES:
        raise ContractError("logprobs_mode", f"must be one of {LOGPROBS_MODES}, "
                                             f"got {p.logprobs_mode!r}")
    if p.allowed_token_ids is not None:
        if not p.allowed_token_ids:
            raise ContractError("allowed_token_ids", "is not None and empty")
        ids_in_vocab("allowed_token_ids", p.allowed_token_ids)
    ids_in_vocab("logit_bias", [k for k, _ in p.logit_bias])
    ids_in_vocab("stop_token_ids", p.stop_token_ids)
    if any(len(w) == 0 for w in p.bad_words):
        raise ContractError("bad_words", "an entry tokenizes to no token")
    ids_in_vocab("bad_words", [t for w in p.bad_words for t in w])
    if p.thinking_token_budget is not None and (isinstance(p.thinking_token_budget, bool)
                                                or p.thinking_token_budget < 0):
        raise ContractError("thinking_token_budget", "must be a non-negative integer or -1 "
                                                     "for unlimited")
    if p.min_p != 0.0:
        raise ContractError("min_p", "not judged by the contracts (a rank property of the "
                                     "row); leave it 0")
    if p.top_k not in (0, -1) or p.top_p != 1.0:
        raise ContractError("top_k" if p.top_k not in (0, -1) else "top_p",
                            "not judged by the contracts (a rank property of the row); "
                            "leave top_k 0 and top_p 1")


# ---- the row contract ---------------------------------------------------------------------------

@dataclass(frozen=True)
class RowContext:
    """Where a logits row sits: the request's prompt, its committed output before this step,
    this step's drafts and the row's local position (row ``j`` sees drafts ``[:j]``)."""

    prompt: tuple[int, ...]
    output: tuple[int, ...]
    drafts: tuple[int, ...] = ()
    local_pos: int = 0
    markers: budget.Markers = field(default_factory=budget.Markers)

    @property
    def seen_output(self) -> list[int]:
        """The output as this row sees it: committed output + drafts ``[:j]``."""
        return list(self.output) + list(self.drafts[:self.local_pos])

    @property
    def out_index(self) -> int:
        """Output index of the token this row produces."""
        return len(self.output) + self.local_pos


@dataclass(frozen=True)
class Expect:
    value: float  # what the processed column must hold (-inf, or a finite value)
    forced: bool  # the budget's forced column: value >= budget.FORCED_LOGIT instead
    by: tuple[str, ...]  # the contracts that changed the column (empty: must equal raw)


def penalised(p: Params, x: float, count: int, in_prompt: bool) -> float:
    """vLLM's penalties on one column (step 4 of the order)."""
    if p.repetition_penalty != 1.0 and (in_prompt or count > 0):
        r = p.repetition_penalty
        x = x / r if x > 0 else x * r
    return x - p.frequency_penalty * count - p.presence_penalty * (1 if count > 0 else 0)


def expected(p: Params, ctx: RowContext, col: int, raw: float) -> Expect:
    """The processed value of column ``col`` of a row whose raw value there is ``raw``."""
    by: list[str] = []
    x = float(raw)
    seen = ctx.seen_output
    if p.allowed_token_ids is not None and col not in p.allowed_token_ids:
        x, by = NEG_INF, ["allowed_token_ids"]
    bias = dict(p.logit_bias)
    if col in bias:
        x += bias[col]
        by.append("logit_bias")
    if p.min_tokens > 0 and ctx.out_index < p.min_tokens and col in p.masked_by_min_tokens:
        x = NEG_INF
        by.append("min_tokens")
    if p.penalised:
        n = seen.count(col)
        y = penalised(p, x, n, col in ctx.prompt)
        if (p.repetition_penalty != 1.0 and (n > 0 or col in ctx.prompt)) or \
                (n > 0 and (p.frequency_penalty != 0.0 or p.presence_penalty != 0.0)):
            by.append("penalties")
        x = y
    for w in p.bad_words:
        pre = list(w[:-1])
        if col == w[-1] and len(pre) <= len(seen) and (not pre or seen[len(seen) - len(pre):]
                                                        == pre):
            x = NEG_INF
            by.append("bad_words")
            break
    forced = False
    if p.thinking_token_budget is not None and ctx.markers.complete:
        t = budget.row_truth(list(ctx.prompt) + list(ctx.output), list(ctx.drafts),
                             ctx.local_pos, p.thinking_token_budget, ctx.markers)
        if t.due and col == t.token:
            forced = True
            by.append("thinking_token_budget")
    if p.temperature not in (0.0, 1.0) and not forced and math.isfinite(x):
        x = x / p.temperature
    return Expect(x, forced, tuple(dict.fromkeys(by)))


@dataclass(frozen=True)
class Breach:
    """One way a row or an output broke a contract."""

    contract: str
    what: str  # a sentence: expected vs found
    column: int | None = None
    out_index: int | None = None

    def to_dict(self) -> dict:
        return {"contract": self.contract, "what": self.what, "column": self.column,
                "out_index": self.out_index}


def close(a: float, b: float) -> bool:
    if math.isinf(a) or math.isinf(b) or math.isnan(a) or math.isnan(b):
        return a == b
    return abs(a - b) <= ATOL + RTOL * max(abs(a), abs(b))


def check_row(p: Params, ctx: RowContext, raw: dict[int, float], processed: dict[int, float],
              finite_count: int | None = None) -> list[Breach]:
    """The processed row at the columns the evidence kept (``raw``/``processed``: column ->
    value) against ``expected``; ``finite_count``: the processed row's number of finite
    columns (allowed_token_ids: none outside the allowed set may stay finite)."""
    out: list[Breach] = []
    for c, r in raw.items():
        if c not in processed:
            continue
        e = expected(p, ctx, c, r)
        got = float(processed[c])
        if e.forced:
            if not got >= budget.FORCED_LOGIT:
                out.append(Breach("thinking_token_budget", f"column {c} due (forced) holds "
                                  f"{got:.6g} < {budget.FORCED_LOGIT:g}", c, ctx.out_index))
            continue
        if not close(got, e.value):
            name = e.by[-1] if e.by else _unchanged_owner(p, c)
            out.append(Breach(name, f"column {c}: expected {e.value:.6g} (raw {r:.6g}"
                              f"{' via ' + ', '.join(e.by) if e.by else ', unchanged'}), "
                              f"found {got:.6g}", c, ctx.out_index))
    if p.allowed_token_ids is not None and finite_count is not None:
        limit = len(set(p.allowed_token_ids))
        if p.thinking_token_budget is not None:
            limit += 1  # the budget's forced column wins over the mask
        if finite_count > limit:
            out.append(Breach("allowed_token_ids", f"{finite_count} finite columns, at most "
                              f"{limit} allowed", None, ctx.out_index))
    return out


def _unchanged_owner(p: Params, col: int) -> str:
    """The contract that names a column whose value must stay raw (a control column)."""
    cs = [c for c in p.constraints() if c not in ("stop", "logprobs", "prompt_logprobs",
                                                   "stop_strings")]
    return cs[0] if cs else "unconstrained"


def must_hold_token(p: Params, ctx: RowContext, token: int) -> Breach | None:
    """A token emitted at a row that the row's contract forbids (a column at -inf)."""
    if p.allowed_token_ids is not None and token not in p.allowed_token_ids:
        return Breach("allowed_token_ids", f"emitted {token}, not allowed", token, ctx.out_index)
    e = expected(p, ctx, token, 0.0)
    if e.value == NEG_INF and not e.forced:
        return Breach(e.by[-1], f"emitted {token}, which this row masks ({', '.join(e.by)})",
                      token, ctx.out_index)
    return None


# ---- the output contract ------------------------------------------------------------------------

def expected_logprob(mode: str, value: float, lse: float) -> float:
    """What vLLM returns for a column holding ``value`` in a row whose logsumexp is ``lse``
    (``value``/``lse`` of the raw row for raw_* modes, of the processed row otherwise)."""
    return value if mode.endswith("_logits") else value - lse


@dataclass(frozen=True)
class GrammarTruth:
    """The emitted tokens fed through the request's grammar (built where xgrammar and the
    engine's tokenizer are: ``workbook.vllm.grammar``): from output index ``start`` (None: the
    reasoning never ended within the output, so vLLM constrained no token), ``fed`` tokens
    accepted, the first one rejected (``first_rejected``: its output index; None: none), and
    whether the grammar reached its end (``terminated``, at output index ``end``: the stop/EOS
    token that closed it; tokens after it are unconstrained in vLLM and not judged)."""

    start: int | None
    fed: int = 0
    first_rejected: int | None = None
    rejected_token: int | None = None
    terminated: bool = False
    end: int | None = None

    @property
    def judged(self) -> bool:
        """At least one emitted token went through the grammar."""
        return self.start is not None and (self.fed > 0 or self.first_rejected is not None)

    @classmethod
    def of(cls, d: "GrammarTruth | dict | None") -> "GrammarTruth | None":
        if d is None or isinstance(d, GrammarTruth):
            return d
        return cls(**{k: d.get(k) for k in ("start", "fed", "first_rejected",
                                              "rejected_token", "terminated", "end")
                      if k in d})

    def to_dict(self) -> dict:
        return asdict(self)


def check_output(p: Params, prompt: Sequence[int], output: Sequence[int],
                 finish_reason: str | None = None, markers: budget.Markers | None = None,
                 text: str | None = None, logprobs: Sequence[float | None] | None = None,
                 logprob_truth: Sequence[float | None] | None = None,
                 grammar: "GrammarTruth | dict | None" = None) -> list[Breach]:
    """What the emitted tokens (the request's final output) must satisfy.

    ``logprobs[i]``: the logprob vLLM returned for output token ``i``; ``logprob_truth[i]``:
    the value the row that emitted it says (``expected_logprob`` over the row evidence).
    ``grammar``: the output through the request's grammar (``GrammarTruth``) — every token from
    the grammar's start up to its end must be accepted (a prefix of a valid JSON: an output
    ended by length holds when every token was accepted), and an output finished by stop must
    have reached the grammar's end."""
    out: list[Breach] = []
    output = [int(t) for t in output]
    if p.max_tokens is not None and len(output) > p.max_tokens:
        out.append(Breach("stop", f"{len(output)} tokens > max_tokens={p.max_tokens}", None,
                          p.max_tokens))
    for i, t in enumerate(output):
        if i < p.min_tokens and t in p.masked_by_min_tokens:
            out.append(Breach("min_tokens", f"stop/EOS token {t} at output index {i} < "
                              f"min_tokens={p.min_tokens}", t, i))
            break
    for i, t in enumerate(output[:-1]):
        if t in p.stopping_ids and i >= p.min_tokens:
            out.append(Breach("stop", f"stop token {t} at index {i}, then {len(output) - i - 1}"
                              f" more token(s)", t, i + 1))
            break
    if finish_reason == "stop" and p.min_tokens > 0 and len(output) < p.min_tokens:
        out.append(Breach("min_tokens", f"finished by stop after {len(output)} < min_tokens="
                          f"{p.min_tokens} tokens", None, len(output)))
    if p.allowed_token_ids is not None:
        allowed = set(p.allowed_token_ids)
        bad = [(i, t) for i, t in enumerate(output) if t not in allowed]
        if bad:
            out.append(Breach("allowed_token_ids", f"token {bad[0][1]} at index {bad[0][0]} not "
                              f"allowed ({len(bad)} such)", bad[0][1], bad[0][0]))
    for w in p.bad_words:
        i = budget.first_index_of(output, w)
        if i >= 0:
            out.append(Breach("bad_words", f"banned sequence {list(w)} at index {i}", w[-1],
                              i + len(w) - 1))
    if p.thinking_token_budget is not None and markers is not None and \
            budget.Markers.of(markers).complete:
        j = budget.judge(prompt, output, p.thinking_token_budget, markers)
        if j.honored is False:
            out.append(Breach("thinking_token_budget", f"end marker due at {j.expected_end_index},"
                              f" first at {j.actual_end_index}", None, j.expected_end_index))
    if p.logprobs is not None and logprobs is not None:
        if len(logprobs) != len(output):
            out.append(Breach("logprobs", f"{len(logprobs)} logprob entries for "
                              f"{len(output)} tokens", None, min(len(logprobs), len(output))))
        for i, (got, want) in enumerate(zip(logprobs, logprob_truth or [])):
            if got is None or want is None:
                continue
            if not close(float(got), float(want)):
                out.append(Breach("logprobs", f"token {output[i]} at index {i}: returned "
                                  f"{float(got):.6g}, its row says {float(want):.6g}",
                                  output[i], i))
                break
    g = GrammarTruth.of(grammar)
    if p.json_schema is not None and g is not None and g.first_rejected is not None:
        out.append(Breach("structured_output", f"token {g.rejected_token} at output index "
                          f"{g.first_rejected} is rejected by the grammar (which started at "
                          f"output index {g.start} and accepted the {g.fed} token(s) before it)",
                          g.rejected_token, g.first_rejected))
    elif p.json_schema is not None and g is not None and g.start is not None and \
            finish_reason == "stop" and not g.terminated:
        out.append(Breach("structured_output", f"finished by stop after {len(output)} tokens "
                          f"with the grammar not at its end ({g.fed} token(s) accepted from "
                          f"output index {g.start})", None, len(output)))
    if p.json_schema is not None and finish_reason == "stop" and text is not None and \
            (g is None or g.start == 0):
        try:
            json.loads(text)
        except ValueError as e:
            out.append(Breach("structured_output", f"finished by stop but not JSON: {e}",
                              None, len(output)))
    return out


def unjudged(p: Params, output: Sequence[int], finish_reason: str | None,
             text: str | None = None, grammar: "GrammarTruth | dict | None" = None,
             no_grammar: str | None = None) -> dict[str, str]:
    """The output contracts ``check_output`` could not judge on this output, each with why
    (``{constraint: why}``); empty when every contract of the request was judged.

    structured_output, with grammar evidence (``grammar``): judged when at least one emitted
    token went through the grammar — an output ended by length whose every token the grammar
    accepted holds as a valid prefix. Not judged when no token did: the reasoning never ended
    within the output (vLLM constrains nothing before it), or the output is empty after it.
    Without grammar evidence (``no_grammar``: why there is none, e.g. xgrammar missing) only a
    finished output's JSON check remains: an output ended by length (or without its text) is
    not judged."""
    out: dict[str, str] = {}
    if p.json_schema is None:
        return out
    g = GrammarTruth.of(grammar)
    if g is not None:
        if g.start is None:
            out["structured_output"] = (
                f"the reasoning never ended within the {len(output)} output tokens, so vLLM "
                f"constrained none of them and the grammar judged none")
        elif not g.judged:
            out["structured_output"] = (
                f"no output token after the grammar's start at output index {g.start} (the "
                f"output has {len(output)} tokens), so the grammar judged none")
        return out
    lacking = f"no grammar evidence ({no_grammar})" if no_grammar else "no grammar evidence"
    if finish_reason != "stop":
        out["structured_output"] = (
            f"{lacking}, and the output ended by {finish_reason or 'an unrecorded reason'} "
            f"after {len(output)} tokens, before the JSON was complete, so the JSON check "
            f"never ran")
    elif text is None:
        out["structured_output"] = f"{lacking}, and the output's text was not returned, so " \
                                   f"the JSON check never ran"
    return out


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """First output index where two greedy outputs differ (None: one is a prefix of the
    other and they are equally long, i.e. identical)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


# ---- host-side contracts: stop strings, prompt logprobs -----------------------------------------

def stop_string_end(p: Params, texts: Sequence[str]) -> tuple[int, str, int] | None:
    """Where a stop string first completes, one token at a time as without speculation:
    ``(i, s, start)`` — output index ``i`` of the token that completes stop string ``s``,
    which starts at character ``start`` of ``texts[i]`` — or None (no stop string completes).

    ``texts[i]``: the text of ``output[:i + 1]`` as the request decodes it (the caller's
    tokenizer, the request's ``skip_special_tokens``). vLLM's order (``check_stop_strings``):
    an occurrence must end in the text of a token at output index ``>= min_tokens``; of the
    strings completed by the same token the one ending first wins, then the list's order. A
    prefix whose text ends in U+FFFD (an incomplete UTF-8 character, which vLLM holds back)
    is skipped."""
    if not p.stop_strings:
        return None
    prev = len(texts[p.min_tokens - 1]) if 0 < p.min_tokens <= len(texts) else 0
    for i, t in enumerate(texts):
        if i < p.min_tokens or t.endswith("\ufffd"):
            continue
        best = None
        for s in p.stop_strings:
            j = t.find(s, max(0, prev - len(s) + 1))
            if j >= 0 and (best is None or j + len(s) < best[2] + len(best[1])):
                best = (i, s, j)
        if best is not None:
            return best
        prev = len(t)
    return None


def check_stop_strings(p: Params, output: Sequence[int], text: str | None,
                       texts: Sequence[str], finish_reason: str | None = None) -> list[Breach]:
    """The stop-string contract on what the user got: once a stop string completes (at output
    index ``i``, ``stop_string_end``), the request ends there — the returned tokens are
    ``output[:i + 1]`` (nothing past the token that completed it, also when later tokens were
    accepted drafts of the same step), the text ends right before the stop string
    (``include_stop_str_in_output``: right after it) and the finish reason is "stop".
    ``texts``: the decoded prefixes of the returned tokens (``stop_string_end``)."""
    hit = stop_string_end(p, texts)
    if hit is None:
        return []
    i, s, start = hit
    out: list[Breach] = []
    extra = len(output) - (i + 1)
    if extra > 0:
        out.append(Breach("stop_strings", f"stop string {s!r} completes at output index {i}, "
                          f"then {extra} more token(s) returned", int(output[i + 1]), i + 1))
    want = texts[i][:start + (len(s) if p.include_stop_str_in_output else 0)]
    if text is not None and text != want:
        out.append(Breach("stop_strings", f"returned text {text[-40:]!r} (length {len(text)}), "
                          f"expected it to end {'after' if p.include_stop_str_in_output else 'before'}"
                          f" stop string {s!r}: {want[-40:]!r} (length {len(want)})", None, i))
    if finish_reason is not None and finish_reason != "stop":
        out.append(Breach("stop_strings", f"stop string {s!r} completed at output index {i} but"
                          f" the request finished by {finish_reason}", None, i))
    return out


def check_prompt_logprobs(prompt: Sequence[int], returned: Sequence[dict | None] | None,
                          truth: Sequence[dict | None] | None = None,
                          row_inputs: Sequence[int | None] | None = None
                          ) -> list[tuple[int | None, Breach]]:
    """The prompt-logprobs contract: ``returned[q]`` (``{token id: logprob}``, position ``q``
    of the prompt; ``q = 0`` has none) holds the prompt's own token ``prompt[q]`` and every
    value equals ``truth[q][id]`` — what the logits row that predicts position ``q`` says
    (the log-softmax, or the logit per ``logprobs_mode``, of the row whose input token is
    ``prompt[q - 1]``); ``row_inputs[q]``: that row's input token as the evidence saw it.
    Returns ``(position, breach)`` pairs, first breach per kind (position None: the list)."""
    out: list[tuple[int | None, Breach]] = []
    if returned is None:
        return out
    if len(returned) != len(prompt):
        out.append((None, Breach("prompt_logprobs", f"{len(returned)} prompt logprob entries "
                                 f"for a prompt of {len(prompt)} tokens")))
    seen: set[str] = set()

    def add(q, kind, b):
        if kind not in seen:
            seen.add(kind)
            out.append((q, b))

    for q in range(1, min(len(returned), len(prompt))):
        d = returned[q]
        if d is None:
            add(q, "missing", Breach("prompt_logprobs", f"position {q}: no entry", prompt[q]))
            continue
        if int(prompt[q]) not in d:
            add(q, "token", Breach("prompt_logprobs", f"position {q}: the prompt's token "
                                   f"{prompt[q]} is not among the returned ids {sorted(d)[:6]}",
                                   int(prompt[q])))
        if row_inputs is not None and q < len(row_inputs) and row_inputs[q] is not None \
                and int(row_inputs[q]) != int(prompt[q - 1]):
            add(q, "row", Breach("prompt_logprobs", f"position {q}: computed from a row whose "
                                 f"input token is {row_inputs[q]}, the prompt has "
                                 f"{prompt[q - 1]} there", int(prompt[q])))
        want = truth[q] if truth is not None and q < len(truth) else None
        if want:
            for t, v in d.items():
                w = want.get(int(t))
                if w is not None and not close(float(v), float(w)):
                    add(q, "value", Breach("prompt_logprobs", f"position {q}, token {t}: "
                                           f"returned {float(v):.6g}, its row says "
                                           f"{float(w):.6g}", int(t)))
                    break
    return out


def prompt_logprobs_divergence(got: Sequence[dict | None] | None,
                               ref: Sequence[dict | None] | None) -> dict | None:
    """The differential of prompt logprobs: None when ``got`` equals ``ref`` (the same
    request without speculation) to the tolerance, else the first position that differs and
    how. Per position the prompt token's logprob must agree, and the returned values sorted
    must agree rank by rank (the top-k ids of a near tie may be ordered differently; their
    values may not differ)."""
    if got is None or ref is None:
        return None if got is ref else {"position": None, "what": "prompt logprobs returned "
                                        "by one run only"}
    if len(got) != len(ref):
        return {"position": None, "what": f"{len(got)} positions vs {len(ref)} without "
                                          f"speculation"}
    for q, (a, b) in enumerate(zip(got, ref)):
        if not a and not b:
            continue
        if not a or not b:
            return {"position": q, "what": "an entry in one run only"}
        a = {int(k): float(v) for k, v in a.items()}
        b = {int(k): float(v) for k, v in b.items()}
        for t in set(a) & set(b):
            if not close(a[t], b[t]):
                return {"position": q, "token": t, "got": a[t], "reference": b[t],
                        "what": f"position {q}, token {t}: {a[t]:.6g} vs {b[t]:.6g} without "
                                f"speculation"}
        va, vb = sorted(a.values(), reverse=True), sorted(b.values(), reverse=True)
        if len(va) != len(vb) or not all(close(x, y) for x, y in zip(va, vb)):
            return {"position": q, "what": f"position {q}: values {[round(x, 6) for x in va]}"
                                           f" vs {[round(x, 6) for x in vb]} without "
                                           f"speculation"}
    return None


def unjudged_host(p: Params, texts: Sequence[str] | None = None,
                  prompt_logprobs: Sequence[dict | None] | None = None) -> dict[str, str]:
    """``unjudged`` for the host-side contracts (``{constraint: why}``): stop strings when
    none completes in the returned tokens' text (the stop was never exercised); prompt
    logprobs when none were returned."""
    out: dict[str, str] = {}
    if p.stop_strings and texts is not None and stop_string_end(p, texts) is None:
        out["stop_strings"] = ("no stop string completes in the output's text, so the stop "
                               "was never exercised")
    if p.prompt_logprobs is not None and prompt_logprobs is None:
        out["prompt_logprobs"] = "no prompt logprobs were returned"
    return out
