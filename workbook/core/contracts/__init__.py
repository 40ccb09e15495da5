"""Per-request sampling constraints as one family of contracts: what a logits row and the
emitted tokens must satisfy, one class per constraint (``base.Contract``; every module of this
package is imported here, and defining a class registers it — a new constraint is one module).

vLLM's processing order of a row inside ``Sampler.apply_sampling_params`` (0.28–0.32, MRV2),
the order ``expected`` folds the contracts' ``row`` steps in (``ROW_ORDER``):

    1. allowed_token_ids   every other column  -> -inf                     (masks)
    2. logit_bias          column c            -> raw + b[c]               (masks)
    3. min_tokens          stop/EOS columns    -> -inf while index < min   (masks; kept with
                           structured output when nothing else is left: ``masks.stop_only``)
    4. penalties           repetition, then - frequency * n - presence     (penalties)
    5. bad_words           last token of a banned sequence -> -inf         (masks)
    6. thinking budget     the forced column   -> >= budget.FORCED_LOGIT   (thinking)
    7. temperature         value / T when T is neither 0 nor 1             (sampling)

The functions below are thin compositions over the family (``check_output``: each active
contract's output check in catalogue order; ``validate``: each contract's; ``CONSTRAINTS``: the
catalogue's names). Deliberately not here: any contract's rule (its module), the evidence
(``workbook.hooks.observe.rowcheck``; the grammar's: ``workbook.vllm.grammar``), judging a run.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any, Callable, Sequence

from workbook.core import budget
from workbook.core.contracts.base import (ATOL, LOGPROBS_MODES, MAX_LOGPROBS, NEG_INF, ROW_ORDER,
                                          RTOL, STAGES, Breach, Contract, ContractError, Expect,
                                          Outcome, Params, RowContext, catalogue, close, family,
                                          get)
from workbook.core.contracts.logprobs import expected_logprob
from workbook.core.contracts.penalties import penalised
from workbook.core.contracts.prompt_logprobs import (check_prompt_logprobs,
                                                     prompt_logprobs_divergence)
from workbook.core.contracts.stop_strings import check_stop_strings, stop_string_end
from workbook.core.contracts.structured import JSON_SCHEMA, GrammarTruth

for _m in sorted(m.name for m in pkgutil.iter_modules(__path__)):  # every contract module
    if _m != "base" and not _m.startswith("_"):
        importlib.import_module(f"{__name__}.{_m}")

CONSTRAINTS = tuple(c.name for c in catalogue())
# grid cases that combine contracts (their keywords: the union of their contracts' cases).
# structured_output+budget: budget 2 forces </think> at output index 1 (one reasoning token in
# the prompt); the grammar must start at output index 2 (vLLM #44297 / #44993's boundary)
CASE_CONTRACTS = {"structured_output+budget": ("thinking_token_budget", "structured_output")}
CASES = CONSTRAINTS + tuple(CASE_CONTRACTS)

__all__ = ["ATOL", "CASES", "CASE_CONTRACTS", "CONSTRAINTS", "JSON_SCHEMA", "LOGPROBS_MODES",
           "MAX_LOGPROBS", "NEG_INF", "ROW_ORDER", "RTOL", "STAGES", "Breach", "Contract",
           "ContractError", "Expect", "GrammarTruth", "Outcome", "Params", "RowContext",
           "case_kwargs", "catalogue", "check_output", "check_prompt_logprobs", "check_row",
           "check_stop_strings", "close", "expected", "expected_logprob", "family",
           "first_divergence", "gated", "get", "must_hold_token", "penalised",
           "prompt_logprobs_divergence", "row_owner", "stop_string_end", "unjudged",
           "unjudged_host", "validate"]


def expected(p: Params, ctx: RowContext, col: int, raw: float) -> Expect:
    """The processed value of column ``col`` of a row whose raw value there is ``raw``: the
    active contracts' ``row`` steps folded in processing order. A column a forcing contract
    (the budget) changed is forced: no later step applies to it."""
    x, by = float(raw), []
    for c in ROW_ORDER:
        if not c.active(p):
            continue
        x, changed = c.row(p, ctx, col, x)
        if changed:
            by.append(c.name)
            if c.forces:
                return Expect(x, True, tuple(dict.fromkeys(by)))
    return Expect(x, False, tuple(dict.fromkeys(by)))


def row_owner(p: Params) -> str:
    """The contract that names a column whose value must stay raw (a control column): the
    first of the request's contracts that processes logits rows."""
    return next((c.name for c in catalogue() if c.active(p) and c.on_rows), "unconstrained")


def gated(p: Params) -> list[str]:
    """The request's contracts that change rows behind the sampler's per-slot gate, the
    unlisted row steps included (temperature: vLLM 0.34.0's
    ``test_logits_processing_cache_matches_request_features`` sets the gate for it)."""
    return [c.name for c in family() if c.active(p) and c.gated]


def check_row(p: Params, ctx: RowContext, raw: dict[int, float], processed: dict[int, float],
              finite_count: int | None = None) -> list[Breach]:
    """The processed row at the columns the evidence kept (``raw``/``processed``: column ->
    value) against ``expected``, then each active contract's row-wide check
    (``finite_count``: the processed row's number of finite columns)."""
    out: list[Breach] = []
    for c, r in raw.items():
        if c not in processed:
            continue
        e = expected(p, ctx, c, r)
        got = float(processed[c])
        if e.forced:
            if not got >= budget.FORCED_LOGIT:
                out.append(Breach(e.by[-1], f"column {c} due (forced) holds {got:.6g} < "
                                            f"{budget.FORCED_LOGIT:g}", c, ctx.out_index))
            continue
        if not close(got, e.value):
            name = e.by[-1] if e.by else row_owner(p)
            out.append(Breach(name, f"column {c}: expected {e.value:.6g} (raw {r:.6g}"
                              f"{' via ' + ', '.join(e.by) if e.by else ', unchanged'}), "
                              f"found {got:.6g}", c, ctx.out_index))
    for k in catalogue():
        if k.active(p):
            out += k.check_row(p, ctx, finite_count)
    return out


def unreachable(p: Params, ctx: RowContext) -> tuple[int, int, int] | None:
    """Whether draft row ``ctx.local_pos`` can ever be used: it stands for "drafts ``[:j]``
    accepted", and a draft that differs from the column a forcing contract forces at its own
    row (p = 1 there) is rejected with certainty, so every later row of the step is discarded
    whatever it holds — vLLM promises nothing about it. Returns (row i, its draft, the forced
    column) for the first such draft, else None."""
    for i in range(min(ctx.local_pos, len(ctx.drafts))):
        at = RowContext(ctx.prompt, ctx.output, ctx.drafts, i, ctx.markers, ctx.stop_only)
        for c in ROW_ORDER:
            if c.forces and c.active(p):
                f = c.forced(p, at)
                if f is not None and int(ctx.drafts[i]) != f:
                    return i, int(ctx.drafts[i]), f
    return None


def must_hold_token(p: Params, ctx: RowContext, token: int) -> Breach | None:
    """A token emitted at a row that the row's contract forbids (a column at -inf)."""
    if p.allowed_token_ids is not None and token not in p.allowed_token_ids:
        return Breach("allowed_token_ids", f"emitted {token}, not allowed", token, ctx.out_index)
    e = expected(p, ctx, token, 0.0)
    if e.value == NEG_INF and not e.forced:
        return Breach(e.by[-1], f"emitted {token}, which this row masks ({', '.join(e.by)})",
                      token, ctx.out_index)
    return None


def check_output(p: Params, prompt: Sequence[int], output: Sequence[int],
                 finish_reason: str | None = None, markers: budget.Markers | None = None,
                 text: str | None = None, logprobs: Sequence[float | None] | None = None,
                 logprob_truth: Sequence[float | None] | None = None,
                 grammar: "GrammarTruth | dict | None" = None) -> list[Breach]:
    """What the emitted tokens (the request's final output) must satisfy: each active
    contract's output check, in catalogue order (the host-evidence contracts, stop strings and
    prompt logprobs, have their own: ``check_stop_strings``, ``check_prompt_logprobs``).

    ``logprobs[i]``: the logprob vLLM returned for output token ``i``; ``logprob_truth[i]``:
    the value the row that emitted it says (``expected_logprob`` over the row evidence).
    ``grammar``: the output through the request's grammar (``GrammarTruth``)."""
    o = Outcome(tuple(prompt), [int(t) for t in output], finish_reason, markers, text,
                logprobs, logprob_truth, grammar)
    return [b for c in catalogue() if c.active(p) and not c.host_evidence
            for b in c.check_output(p, o)]


def unjudged(p: Params, output: Sequence[int], finish_reason: str | None,
             text: str | None = None, grammar: "GrammarTruth | dict | None" = None,
             no_grammar: str | None = None) -> dict[str, str]:
    """The output contracts ``check_output`` could not judge on this output, each with why
    (``{constraint: why}``); empty when every contract of the request was judged."""
    o = Outcome((), list(output), finish_reason, None, text, grammar=grammar,
                no_grammar=no_grammar)
    return _unjudged(p, o, host=False)


def unjudged_host(p: Params, texts: Sequence[str] | None = None,
                  prompt_logprobs: Sequence[dict | None] | None = None) -> dict[str, str]:
    """``unjudged`` for the host-evidence contracts (``{constraint: why}``): stop strings when
    none completes in the returned tokens' text; prompt logprobs when none were returned."""
    return _unjudged(p, Outcome(texts=texts, prompt_logprobs=prompt_logprobs), host=True)


def _unjudged(p: Params, o: Outcome, host: bool) -> dict[str, str]:
    out = {}
    for c in catalogue():
        if c.active(p) and c.host_evidence == host:
            why = c.unjudged(p, o)
            if why:
                out[c.name] = why
    return out


def validate(p: Params, vocab_size: int, max_logprobs: int = MAX_LOGPROBS) -> None:
    """Raise ``ContractError`` naming the parameter for what vLLM's ``SamplingParams`` would
    reject (vLLM 0.28–0.32 ``_verify_args`` and ``verify``), and for what the contracts cannot
    judge (min_p, top-k/top-p): each contract's ``validate``. A refusal that depends on the
    speculative method (0.32's ``_validate_spec_decode``) is deliberately not predicted:
    vLLM's own message is the result."""
    for c in family():
        c.validate(p, vocab_size, max_logprobs)


def case_kwargs(name: str, baseline: Sequence[int], decode: Callable[[list[int]], str]
                ) -> dict[str, Any]:
    """The grid case ``name``'s ``SamplingParams`` keywords (``CASES``), derived from the
    unconstrained greedy output ``baseline``; a combined case merges its contracts' cases."""
    parts = CASE_CONTRACTS.get(name, (name,))
    kw: dict[str, Any] = {}
    for n in parts:
        case = get(n).case(baseline, decode)
        if case is None:
            raise KeyError(name)
        kw.update(case)
    return kw


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """First output index where two greedy outputs differ (None: one is a prefix of the
    other and they are equally long, i.e. identical)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))
