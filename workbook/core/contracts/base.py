"""The contract family's common ground: a request's constraint parameters (``Params``), where a
logits row sits (``RowContext``), what a column must hold (``Expect``), one way a row or an
output broke a contract (``Breach``), what the user got (``Outcome``), the ``Contract`` interface
and the registry every contract class joins by being defined.

A contract class states what vLLM promises users about one sampling setting (its docs and API:
what the setting means), never what vLLM's code happens to do. Its interface: ``name``; the
request parameters it ``reads``; ``active(p)``; the static ``columns`` it names; its ``step`` of
the expected processed row (``row``: the value a column must hold, from the raw value, the
committed history and the row's draft position; ``step`` is vLLM's processing order, below);
``check_row`` (row-wide checks); ``check_output`` / ``unjudged`` on the final output;
``validate`` (what vLLM's ``SamplingParams`` would reject); the MRV2 ``stages`` it passes; and
``case`` (the grid case's ``SamplingParams`` keywords).

Two orders: ``REGISTRY`` is the catalogue order (``rank``: the thinking budget first; the order of
``CONSTRAINTS`` and of a request's ``Params.constraints()``), ``ROW_ORDER`` the processing order
(``step``). Deliberately not here: any contract's rule (its module), anything that reads vLLM,
torch or xgrammar objects (``Params.of`` only reads attributes).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Sequence

from workbook.core import budget
from workbook.core import stages as _stages

NEG_INF = float("-inf")
LOGPROBS_MODES = ("raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits")
MAX_LOGPROBS = 20  # vLLM's default ModelConfig.max_logprobs
RTOL, ATOL = 1e-4, 1e-5  # float32 arithmetic in vLLM's kernels vs this rule in float64
# the MRV2 stages a contract's evidence can name: the one list (``workbook.core.stages``)
STAGES = _stages.NAMES
ROW_STAGES = ("gate", "apply", "apply on draft rows", "grammar bitmask")


class ContractError(ValueError):
    """A constraint parameter vLLM would reject; names the parameter. Raised before any
    engine starts."""

    def __init__(self, parameter: str, message: str):
        super().__init__(f"{parameter}: {message}")
        self.parameter = parameter


def close(a: float, b: float) -> bool:
    if math.isinf(a) or math.isinf(b) or math.isnan(a) or math.isnan(b):
        return a == b
    return abs(a - b) <= ATOL + RTOL * max(abs(a), abs(b))


def ids_in_vocab(name: str, ids, vocab_size: int) -> None:
    """``ContractError`` naming ``name`` for token ids outside ``[0, vocab_size)``."""
    bad = [t for t in ids if not 0 <= int(t) < vocab_size]
    if bad:
        raise ContractError(name, f"token id(s) {bad} outside the vocabulary [0, {vocab_size})")


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
        v = self.thinking_token_budget  # -1 is vLLM's "no budget"; any other value is kept
        if type(v) is int and v == -1:  # for ``validate`` to judge (budget.budget_param)
            s(self, "thinking_token_budget", None)

    @classmethod
    def of(cls, sp: Any, logprobs_mode: str = "raw_logprobs") -> "Params":
        """From vLLM's ``SamplingParams`` (attributes; as the worker holds them) or a dict of
        the same names (``bad_words`` there: token id lists). ``thinking_token_budget`` is
        kept as given (-1: None), for ``validate`` to refuse what vLLM refuses."""
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
        return cls(max_tokens=get("max_tokens"), min_tokens=int(get("min_tokens") or 0),
                   stop_token_ids=stop, eos_token_ids=eos,
                   ignore_eos=bool(get("ignore_eos") or False),
                   logit_bias=tuple((get("logit_bias") or {}).items()),
                   allowed_token_ids=get("allowed_token_ids"),  # [] kept: vLLM refuses it
                   bad_words=tuple(bad or ()),
                   repetition_penalty=float(get("repetition_penalty", 1.0) or 1.0),
                   presence_penalty=float(get("presence_penalty") or 0.0),
                   frequency_penalty=float(get("frequency_penalty") or 0.0),
                   temperature=float(get("temperature") or 0.0),
                   logprobs=get("logprobs"), logprobs_mode=logprobs_mode,
                   thinking_token_budget=get("thinking_token_budget"),
                   json_schema=schema, min_p=float(get("min_p") or 0.0),
                   top_k=int(get("top_k") or 0), top_p=float(get("top_p") or 1.0),
                   prompt_logprobs=get("prompt_logprobs"),
                   stop_strings=get("stop") or (),
                   include_stop_str_in_output=bool(get("include_stop_str_in_output") or False))

    # ---- which contracts a request carries (read from the registry) ------------------------------
    @property
    def penalised(self) -> bool:
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 \
            or self.frequency_penalty != 0.0

    def constraints(self) -> list[str]:
        """The contracts this request is judged by (``CONSTRAINTS`` names, in that order)."""
        return [c.name for c in catalogue() if c.active(self)]

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
        """The static columns the contracts name for every row of this request, in processing
        order (penalties add the history's and the drafts' columns, which the evidence gathers
        on the device)."""
        cols: list[int] = []
        for c in ROW_ORDER:
            if c.active(self):
                cols += c.columns(self, markers)
        return list(dict.fromkeys(cols))


@dataclass(frozen=True)
class RowContext:
    """Where a logits row sits: the request's prompt, its committed output before this step,
    this step's drafts and the row's local position (row ``j`` sees drafts ``[:j]``)."""

    prompt: tuple[int, ...]
    output: tuple[int, ...]
    drafts: tuple[int, ...] = ()
    local_pos: int = 0
    markers: budget.Markers = field(default_factory=budget.Markers)
    # the row as min_tokens receives it (the grammar bitmask, allowed_token_ids and logit_bias
    # applied) is finite at none but the request's stop/EOS columns (``masks.stop_only``);
    # False where unknown
    stop_only: bool = False

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


@dataclass(frozen=True)
class Outcome:
    """What the user got for one request, and the evidence judged against it (each ``None``
    when the caller has none): the final output, its finish reason and text, the reasoning
    markers, the returned logprobs and what their rows say (``logprob_truth``), the grammar's
    verdict (``grammar``: ``GrammarTruth`` or its dict; ``no_grammar``: why there is none), the
    decoded prefixes of the output (``texts``) and the returned prompt logprobs."""

    prompt: Sequence[int] = ()
    output: Sequence[int] = ()
    finish_reason: str | None = None
    markers: budget.Markers | None = None
    text: str | None = None
    logprobs: Sequence[float | None] | None = None
    logprob_truth: Sequence[float | None] | None = None
    grammar: Any = None
    no_grammar: str | None = None
    texts: Sequence[str] | None = None
    prompt_logprobs: Sequence[dict | None] | None = None


def case_tokens(baseline: Sequence[int]) -> tuple[int, int, list[int]]:
    """The grid cases' tokens from the unconstrained greedy output: its first two tokens and
    three other ids (so each constraint binds on a token the model would emit)."""
    b0 = int(baseline[0]) if baseline else 0
    b1 = int(baseline[1]) if len(baseline) > 1 else b0
    return b0, b1, [t for t in (5, 6, 7, 8) if t != b0][:3]


class Contract:
    """One per-request sampling constraint. Subclasses set ``name`` (the registry key), ``rank``
    (catalogue position) and, when they change logits rows, ``step`` (vLLM's processing
    order); every method has a neutral default, so a contract overrides only what it states.
    Defining a subclass with a ``name`` registers one instance of it."""

    name: ClassVar[str] = ""
    rank: ClassVar[int] = 1000
    step: ClassVar[int | None] = None  # processing order of ``row`` (None: changes no row)
    reads: ClassVar[tuple[str, ...]] = ()  # the ``Params`` fields it reads
    stages: ClassVar[tuple[str, ...]] = ()  # the MRV2 stages it passes (``STAGES``)
    listed: ClassVar[bool] = True  # a constraint of its own (``CONSTRAINTS``)
    host_evidence: ClassVar[bool] = False  # judged on host evidence (texts, prompt logprobs)
    forces: ClassVar[bool] = False  # a column it changes is forced (>= budget.FORCED_LOGIT)

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if cls.name:
            if cls.name in _BY_NAME:
                raise TypeError(f"contract {cls.name!r} is defined twice")
            _BY_NAME[cls.name] = cls()
            _REGISTRY[:] = sorted(_BY_NAME.values(), key=lambda c: (c.rank, c.name))
            ROW_ORDER[:] = sorted((c for c in _REGISTRY if c.step is not None),
                                  key=lambda c: c.step)

    def active(self, p: Params) -> bool:
        return False

    def columns(self, p: Params, markers: budget.Markers | None) -> list[int]:
        return []

    def row(self, p: Params, ctx: RowContext, col: int, x: float) -> tuple[float, bool]:
        """This step of the processed value of column ``col`` (``x``: the value after the
        earlier steps); ``changed``: this contract changed the column."""
        return x, False

    def forced(self, p: Params, ctx: RowContext) -> int | None:
        """The column this contract forces in the row (a forcing contract), else None."""
        return None

    def check_row(self, p: Params, ctx: RowContext, finite_count: int | None) -> list[Breach]:
        """Row-wide checks beyond the kept columns (``finite_count``: the processed row's
        number of finite columns, when gathered)."""
        return []

    def check_output(self, p: Params, o: Outcome) -> list[Breach]:
        return []

    def unjudged(self, p: Params, o: Outcome) -> str | None:
        """Why this contract could not be judged on ``o`` (None: judged, or inactive)."""
        return None

    def validate(self, p: Params, vocab_size: int, max_logprobs: int) -> None:
        """Raise ``ContractError`` for what vLLM's ``SamplingParams`` would reject."""

    def case(self, baseline: Sequence[int], decode: Callable[[list[int]], str]
             ) -> dict[str, Any] | None:
        """The grid case's ``SamplingParams`` keywords (None: no grid case)."""
        return None

    @property
    def on_rows(self) -> bool:
        """It names logits columns (a stage that processes the row)."""
        return any(s in ROW_STAGES for s in self.stages)

    @property
    def gated(self) -> bool:
        """It changes rows through the sampler, behind the per-slot gate."""
        return "gate" in self.stages


_BY_NAME: dict[str, Contract] = {}
_REGISTRY: list[Contract] = []
ROW_ORDER: list[Contract] = []


def catalogue() -> list[Contract]:
    """Every contract of the family, in catalogue order (``rank``)."""
    return [c for c in _REGISTRY if c.listed]


def family() -> list[Contract]:
    """Every contract, the unlisted row steps included (temperature), in catalogue order."""
    return list(_REGISTRY)


def get(name: str) -> Contract:
    return _BY_NAME[name]
