"""The request reported in vLLM #54906, its outcome as the server reports it, and checks A and B.

Reported request (vLLM #54906): chat completion with ``enable_thinking`` (and ``preserve_thinking``
passed through to the chat template), ``thinking_token_budget=1``, ``max_tokens=32``; the prompt
ends ``<think>\\n``. Healthy vLLM emits ``</think>`` as the first generated token, because the
prompt's ``\\n`` already is one reasoning token.

- ``prompt_ids(tokenizer, cfg)``: the chat-templated prompt token ids.
- ``run_reported(engine)``: send it in-process, return ``Outcome`` (finish_reason,
  completion_tokens, reasoning_tokens counted by vLLM's reasoning parser, content, token ids,
  first token, where ``</think>`` was expected and whether the budget was honored).
- ``run_budgets(engine, budgets)``: the reported request at several budgets in one batch.
- ``check_a`` / ``check_b`` (``CHECKS``): the deterministic checks, each one batch. Check B
  zeroes the target's ``lm_head`` (restored afterwards) so target and drafter agree on token 0
  and drafts are accepted.

The verdict of each outcome is the one budget rule's (``workbook.core.budget.judge``).
Not here: tracing or diagnosis; the OpenAI server (``workbook.run.server``).
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

from workbook.core.budget import Markers, judge
from workbook.vllm import lmhead

def messages(cfg) -> list[dict[str, str]]:
    return [{"role": "user", "content": cfg.prompt}]


def chat_template_kwargs(cfg) -> dict[str, Any]:
    return {"enable_thinking": cfg.enable_thinking, "preserve_thinking": cfg.preserve_thinking}


def prompt_ids(tokenizer, cfg) -> list[int]:
    ids = tokenizer.apply_chat_template(messages(cfg), add_generation_prompt=True, tokenize=True,
                                        **chat_template_kwargs(cfg))
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # BatchEncoding (transformers 5)
        ids = ids["input_ids"]
    return [int(t) for t in ids]


def sampling_params(cfg, *, budget: int | None = "cfg", max_tokens: int | None = None, **kw):
    from vllm import SamplingParams

    b = cfg.budget if budget == "cfg" else budget
    b = None if b is None else int(b)  # vLLM takes an int (1.0 is rejected)
    args = dict(temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k,
                max_tokens=max_tokens or cfg.max_tokens, ignore_eos=cfg.ignore_eos,
                seed=cfg.seed if cfg.temperature > 0 else None, thinking_token_budget=b)
    args.update(kw)
    return SamplingParams(**args)


@dataclass
class Outcome:
    request_id: str
    budget: int | None
    max_tokens: int
    prompt_tail: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str | None
    completion_tokens: int
    reasoning_tokens: int | None
    reasoning: str | None
    content: str | None
    first_token: int | None
    first_token_text: str | None
    end_token_ids: list[int]
    expected_end_index: int | None
    actual_end_index: int
    honored: bool | None  # None: the budget could not bind within max_tokens
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def reasoning_split(tokenizer, parser_name: str, prompt: Sequence[int], output: Sequence[int],
                    text: str, cfg) -> tuple[int | None, str | None, str | None]:
    """(reasoning_tokens, reasoning, content) as vLLM's reasoning parser reports them."""
    try:
        from vllm.reasoning import ReasoningParserManager

        parser = ReasoningParserManager.get_reasoning_parser(parser_name)(tokenizer)
    except Exception:
        return None, None, None
    with contextlib.suppress(Exception):
        parser.adjust_initial_state_from_prompt(list(prompt))
    count = None
    with contextlib.suppress(Exception):
        count = int(parser.count_reasoning_tokens(list(output)))
    reasoning = content = None
    try:
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    except Exception:
        try:
            from vllm.entrypoints.openai.protocol import ChatCompletionRequest
        except Exception:
            ChatCompletionRequest = None
    req = None
    if ChatCompletionRequest is not None:
        with contextlib.suppress(Exception):
            req = ChatCompletionRequest(model="workbook", messages=messages(cfg),
                                        chat_template_kwargs=chat_template_kwargs(cfg))
    with contextlib.suppress(Exception):
        reasoning, content = parser.extract_reasoning(text, req)
    return count, reasoning, content


def outcome_from(tokenizer, cfg, effective, request_id, prompt, output, text, finish_reason,
                 *, budget="cfg", max_tokens=None) -> Outcome:
    markers = Markers.of(effective)
    b = cfg.budget if budget == "cfg" else budget
    mt = max_tokens or cfg.max_tokens
    j = judge(prompt, output, b, markers)
    count, reasoning, content = reasoning_split(tokenizer, cfg.reasoning_parser, prompt, output,
                                                text, cfg)
    first = int(output[0]) if output else None
    return Outcome(request_id=request_id, budget=b, max_tokens=mt, prompt_tail=list(prompt[-4:]),
                   token_ids=[int(t) for t in output], text=text, finish_reason=finish_reason,
                   completion_tokens=len(output), reasoning_tokens=count, reasoning=reasoning,
                   content=content, first_token=first,
                   first_token_text=tokenizer.decode([first]) if first is not None else None,
                   end_token_ids=list(markers.end), expected_end_index=j.expected_end_index,
                   actual_end_index=j.actual_end_index, honored=j.honored)


def generate(engine, prompts_ids: list[list[int]], params_list) -> list:
    """``llm.generate`` on token prompts; outputs in prompt order."""
    prompts = [{"prompt_token_ids": p} for p in prompts_ids]
    return engine.llm.generate(prompts, params_list, use_tqdm=False)


def run_budgets(engine, budgets: Sequence[int | None | str], max_tokens: int | None = None,
                **params) -> list[Outcome]:
    """The reported request once per budget, all in one ``generate`` call (prompt order).

    A budget of ``"cfg"`` means the configuration's own; any other is passed to vLLM as an
    ``int`` (or None). ``params``: further ``SamplingParams`` fields for every request."""
    cfg, tok = engine.cfg, engine.tokenizer
    prompt = prompt_ids(tok, cfg)
    budgets = [b if b is None or b == "cfg" else int(b) for b in budgets]
    params = [sampling_params(cfg, budget=b, max_tokens=max_tokens, **params) for b in budgets]
    outs = generate(engine, [prompt] * len(budgets), params)
    return [outcome_from(tok, cfg, engine.effective, out.request_id, prompt,
                         list(out.outputs[0].token_ids), out.outputs[0].text,
                         out.outputs[0].finish_reason, budget=b, max_tokens=max_tokens)
            for out, b in zip(outs, budgets)]


def run_reported(engine, *, budget="cfg", max_tokens=None, n: int = 1) -> list[Outcome]:
    """Send the reported request ``n`` times in one batch; one ``Outcome`` each."""
    return run_budgets(engine, [budget] * n, max_tokens)


def check_a(engine, budgets: Sequence[int] = (1, 0)) -> list[Outcome]:
    """Check A, one batch: greedy, ignore_eos, prompt ending ``<think>\\n``: ``</think>`` at the
    budget (first for budgets 1 and 0; the prompt's ``\\n`` is one reasoning token)."""
    return run_budgets(engine, budgets, max_tokens=8)


@contextlib.contextmanager
def _edited_lm_heads(engine, edit):
    """Apply ``edit(weight)`` in place to the target ``lm_head`` (and a drafter's own one)
    (``workbook.vllm.lmhead``); the original weights are restored on exit."""
    restore = lmhead.apply(engine.runner, edit)
    try:
        yield lmhead.lm_heads(engine.runner)
    finally:
        restore()


def zeroed_lm_head(engine):
    """Zero the target ``lm_head`` (and a drafter's own one) so every logit is 0 → token 0;
    restored on exit (a context manager)."""
    return _edited_lm_heads(engine, lmhead.edit_fn("zero"))


def scaled_lm_head(engine, factor: float):
    """Multiply the target ``lm_head`` (and a drafter's own one) by ``factor``, restored on exit
    (a context manager).

    The tiny models' own logits are about 1e-5 (every row's log-softmax equals -log(VOCAB) to
    1e-6, so rows cannot be told apart by value); ``factor`` 1e5 spreads them to order 1, so
    each row's distribution is its own.
    """
    return _edited_lm_heads(engine, lmhead.edit_fn("scaled", factor))


def check_b(engine, budgets: Sequence[int] = tuple(range(2, 10)), max_tokens: int = 24):
    """Check B, one batch: with drafts accepted (zeroed ``lm_head``: target and drafter both
    pick token 0), ``</think>`` lands exactly at every budget 2..9 — every offset of a 4-token
    draft window. Each outcome's ``extra["check_b_prefix_ok"]``: tokens are exactly
    ``[0] * expected + end``."""
    with zeroed_lm_head(engine):
        outcomes = run_budgets(engine, budgets, max_tokens)
    for o in outcomes:
        exp = o.expected_end_index
        want = ([0] * exp + o.end_token_ids) if exp is not None else None
        o.extra["check_b_prefix_ok"] = want is not None and o.token_ids[:len(want)] == want
    return outcomes


CHECKS = {"A": check_a, "B": check_b}


def check_ok(name: str, outcomes) -> bool:
    """Whether a check's outcomes (``Outcome``s, or their dicts as written to checks.json)
    are all exact."""
    def get(o, k):
        return o.get(k) if isinstance(o, dict) else getattr(o, k)

    if name == "B":
        return all((get(o, "extra") or {}).get("check_b_prefix_ok") and get(o, "honored") is True
                   for o in outcomes)
    return all(get(o, "honored") is True for o in outcomes)
