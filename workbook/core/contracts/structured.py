"""The structured-output contract (a JSON schema): every token from where vLLM starts the
grammar (after the reasoning) is one the grammar accepts, so the output is always a valid
prefix; an output finished by stop is complete (the grammar at its end, the text JSON).

Judged on ``GrammarTruth``, the evidence a caller builds with xgrammar and the engine's
tokenizer (``workbook.vllm.grammar``): the output fed through the request's grammar. Without it
only a finished output's JSON check remains. ``unjudged`` says why nothing could be judged (no
token under the grammar, or no evidence and no finished output) — never counted as held.

Which rows the grammar binds (``grammar_bound_rows``): those vLLM samples a token from that it
returns — not a prefill chunk short of the prompt's end, not a step vLLM ran for a request
that had already finished.

Deliberately not here: regex, choice and grammar constraints (``Params`` keeps only ``json``),
xgrammar itself, the grammar's per-row check (``workbook.run.constraints.cases`` over the row
evidence), decoding.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from workbook.core.contracts.base import Breach, Contract

JSON_SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


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


def grammar_bound_rows(steps: list[dict], req: str, returned: int):
    """``(step record, rows)`` of request ``req`` (the row check's records, in step order) for
    the rows the grammar bitmask binds: those of a step where vLLM sampled for the request
    (``emitted``, its ``num_sampled`` > 0), at an output index below ``returned`` (the tokens
    vLLM gave back). Not bound: a prefill chunk short of the prompt's end samples nothing, and
    vLLM leaves its request out of that step's bitmask (``Scheduler.get_grammar_bitmask``:
    ``not req.is_prefill_chunk``); a row at or past ``returned`` makes no token the user gets —
    under async scheduling vLLM runs one more step when it cannot be sure the last one reached
    ``max_tokens`` (``Scheduler.schedule``), computes that step's bitmask once the request has
    finished (no longer among the scheduler's requests: no mask row) and discards what it
    samples there (``Scheduler.update_from_output``: the request is gone)."""
    n = 0
    for rec in steps:
        if rec["req_id"] != req or not rec["emitted"]:
            continue
        if n >= returned:
            return
        yield rec, [row for row in rec["rows"] if n + row["local_pos"] < returned]
        n += len(rec["emitted"])


class StructuredOutput(Contract):
    """``structured_outputs.json``: a grammar-valid prefix; complete when finished by stop."""

    name = "structured_output"
    rank = 90
    reads = ("json_schema",)
    stages = ("grammar bitmask", "sampling", "acceptance")

    def active(self, p):
        return p.json_schema is not None

    def check_output(self, p, o):
        out, n = [], len(o.output)
        g = GrammarTruth.of(o.grammar)
        if g is not None and g.first_rejected is not None:
            out.append(Breach(self.name, f"token {g.rejected_token} at output index "
                              f"{g.first_rejected} is rejected by the grammar (which started at "
                              f"output index {g.start} and accepted the {g.fed} token(s) before "
                              f"it)", g.rejected_token, g.first_rejected))
        elif g is not None and g.start is not None and o.finish_reason == "stop" and \
                not g.terminated:
            out.append(Breach(self.name, f"finished by stop after {n} tokens with the grammar "
                              f"not at its end ({g.fed} token(s) accepted from output index "
                              f"{g.start})", None, n))
        if o.finish_reason == "stop" and o.text is not None and (g is None or g.start == 0):
            try:
                json.loads(o.text)
            except ValueError as e:
                out.append(Breach(self.name, f"finished by stop but not JSON: {e}", None, n))
        return out

    def unjudged(self, p, o):
        """With grammar evidence: judged when at least one emitted token went through the
        grammar (an output ended by length whose every token was accepted holds as a valid
        prefix); not when none did (the reasoning never ended within the output, or nothing
        followed it). Without (``no_grammar``: why) only a finished output's JSON check
        remains: an output ended by length, or without its text, is not judged."""
        n = len(o.output)
        g = GrammarTruth.of(o.grammar)
        if g is not None:
            if g.start is None:
                return (f"the reasoning never ended within the {n} output tokens, so vLLM "
                        f"constrained none of them and the grammar judged none")
            if not g.judged:
                return (f"no output token after the grammar's start at output index {g.start} "
                        f"(the output has {n} tokens), so the grammar judged none")
            return None
        lacking = f"no grammar evidence ({o.no_grammar})" if o.no_grammar else \
            "no grammar evidence"
        if o.finish_reason != "stop":
            return (f"{lacking}, and the output ended by "
                    f"{o.finish_reason or 'an unrecorded reason'} after {n} tokens, before the "
                    f"JSON was complete, so the JSON check never ran")
        if o.text is None:
            return f"{lacking}, and the output's text was not returned, so the JSON check " \
                   f"never ran"
        return None

    def case(self, baseline, decode):
        return {"structured_outputs": {"json": JSON_SCHEMA}}
