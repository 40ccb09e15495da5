"""Grammar evidence for structured outputs: the request's JSON schema compiled with xgrammar
against the engine's tokenizer the way vLLM's xgrammar backend compiles it, and the emitted
tokens fed through a ``GrammarMatcher`` (``contracts.GrammarTruth``, judged by
``contracts.check_output``).

How vLLM (0.32, ``vllm/v1/structured_output``) builds the grammar, restated here:

- ``xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=model_config.get_vocab_size())``
  (the model's vocabulary size, not the tokenizer's);
- ``compile_json_schema(schema, any_whitespace=not disable_any_whitespace, separators=(",",
  ":") if disable_any_whitespace else None)``;
- ``GrammarMatcher(ctx, override_stop_tokens=all_stop_token_ids or None)``: the request's stop
  ids and EOS (the engine adds EOS; EOS even with ``ignore_eos``) end the grammar — the matcher
  accepts one only where the JSON can end, and is then terminated;
- tokens after the grammar terminated are not fed (``XgrammarGrammar.accept_tokens`` ignores
  them; the bitmask is full from there on), so they are not judged here either.

Where the grammar starts (``grammar_start``): with a reasoning parser (and
``enable_in_reasoning`` off) vLLM applies the grammar only after the reasoning ended — from
output index 0 when the prompt already ends the reasoning (an end marker after the last start
marker, e.g. a chat template's ``enable_thinking=False``), else from the token *after* the
first natural end (the parser's ``</think>``, never a token of a configured ``reasoning_end_str``
phrase) in the output; a reasoning that never ends leaves every token
unconstrained (``start`` None). This is read from the reasoning markers (``budget.Markers``),
not from vLLM's reasoning parser, so a reasoning-boundary error in vLLM (the grammar starting a
token late or early when ``</think>`` lands inside a step's accepted drafts, vLLM #44297 /
#44993's bug class) shows as a rejected token here. Reasoning parsers whose end is implicit (a
content token ends the reasoning without an end marker) are not modelled.

``for_model``: the same checker for a served model (``check-server --constraints``), built from the
model's folder with vLLM's default structured-output settings (xgrammar, any whitespace: a
server with ``disable_any_whitespace`` emits a subset of what this grammar accepts, so no
valid output is rejected; a whitespace breach of that setting is not seen).

``allowed(prefix, token)``: whether the grammar, advanced through ``prefix`` (the grammar's part
of the output as a row sees it: committed output + the row's earlier drafts), allows ``token``
next — the row evidence's check (``workbook.run.constraints.cases``).

Deliberately not here: the contract (``workbook.core.contracts``), other structured output
kinds (regex, choice, grammar, structural tags: ``for_request`` returns None for them), the
guidance / outlines backends (None as well: their tokenizer handling differs).
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from workbook.core import budget, contracts


def available() -> str | None:
    """None when xgrammar imports, else why not (a sentence)."""
    try:
        import xgrammar  # noqa: F401
    except Exception as e:  # pragma: no cover - depends on the install
        return f"xgrammar does not import here ({type(e).__name__}: {e})"
    return None


def grammar_start(prompt: Sequence[int], output: Sequence[int], markers: Any,
                  reasoning: bool) -> int | None:
    """The output index of the first token vLLM constrains: 0 without a reasoning parser (or
    when the prompt ends the reasoning), else the index after the first natural end in the
    output; None when the reasoning never ends within the output.

    The boundary is the reasoning parser's: vLLM starts the grammar where the parser says the
    reasoning ended, i.e. at its natural end marker (``Markers.natural_end``, ``</think>``), not
    at a configured ``reasoning_end_str`` (whose tokens may be a transition phrase: matching any
    of those ids would start the grammar inside the phrase). Markers are matched as whole
    sequences."""
    if not reasoning:
        return 0
    m = budget.Markers.of(markers)
    end = list(m.natural_end)
    if not end:
        return 0
    prompt, output = list(prompt), list(output)
    s = budget.last_index_of(prompt, m.start)
    if budget.last_index_of(prompt, end, start=s + len(m.start) if s >= 0 else 0) >= 0:
        return 0
    lo = max(0, len(prompt) - len(end) + 1)  # an end that finishes inside the output
    i = budget.first_index_of((prompt + output)[lo:], end)
    return None if i < 0 else lo + i + len(end) - len(prompt)


class Checker:
    """One request's compiled JSON-schema grammar (vLLM's xgrammar settings)."""

    def __init__(self, tokenizer, vocab_size: int, schema: dict, stop_ids: Sequence[int] = (),
                 disable_any_whitespace: bool = False):
        import xgrammar as xgr

        self.xgr = xgr
        self.vocab_size = int(vocab_size)
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=self.vocab_size)
        compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self.ctx = compiler.compile_json_schema(
            json.dumps(schema) if not isinstance(schema, str) else schema,
            any_whitespace=not disable_any_whitespace,
            separators=(",", ":") if disable_any_whitespace else None)
        self.stop_ids = [int(t) for t in stop_ids] or None
        self._masks: dict[tuple, Any] = {}

    def matcher(self):
        return self.xgr.GrammarMatcher(self.ctx, override_stop_tokens=self.stop_ids)

    def _advanced(self, tokens: Sequence[int]):
        """A fresh matcher advanced through ``tokens``; None if one is rejected or the grammar
        terminated before the last."""
        m = self.matcher()
        for t in tokens:
            if m.is_terminated() or not m.accept_token(int(t)):
                return None
        return m

    def allowed_mask(self, prefix: Sequence[int]):
        """The tokens the grammar allows after ``prefix`` (a numpy bool array over the
        vocabulary); None when ``prefix`` itself is rejected or the grammar already ended
        within it (no grammar state to judge a row by: vLLM leaves such rows unconstrained or
        never schedules them)."""
        import numpy as np

        key = tuple(int(t) for t in prefix)
        if key in self._masks:
            return self._masks[key]
        m = self._advanced(key)
        mask = None
        if m is not None and not m.is_terminated():
            words = self.xgr.allocate_token_bitmask(1, self.vocab_size)
            m.fill_next_token_bitmask(words, 0)
            bits = np.unpackbits(words.numpy().view(np.uint8), bitorder="little")
            mask = bits[:self.vocab_size].astype(bool)
        self._masks[key] = mask
        return mask

    def allowed(self, prefix: Sequence[int], token: int) -> bool | None:
        """Whether ``token`` may follow ``prefix`` (None: see ``allowed_mask``)."""
        mask = self.allowed_mask(prefix)
        if mask is None:
            return None
        t = int(token)
        return bool(0 <= t < self.vocab_size and mask[t])

    def truth(self, prompt: Sequence[int], output: Sequence[int], markers: Any,
              reasoning: bool) -> contracts.GrammarTruth:
        """The emitted tokens through the grammar from ``grammar_start``: the first token it
        rejects, whether it terminated and where."""
        output = [int(t) for t in output]
        start = grammar_start(prompt, output, markers, reasoning)
        if start is None:
            return contracts.GrammarTruth(start=None, fed=0)
        m = self.matcher()
        for i in range(start, len(output)):
            if not m.accept_token(output[i]):
                return contracts.GrammarTruth(start=start, fed=i - start, first_rejected=i,
                                              rejected_token=output[i])
            if m.is_terminated():
                return contracts.GrammarTruth(start=start, fed=i - start + 1, terminated=True,
                                              end=i)
        return contracts.GrammarTruth(start=start, fed=len(output) - start,
                                      terminated=m.is_terminated())


def for_request(llm, tokenizer, params: contracts.Params) -> tuple["Checker | None", str | None]:
    """(the checker, None) of a request with a JSON schema on engine ``llm`` (``vllm.LLM``),
    compiled with the engine's settings; (None, why) when no grammar evidence can be built
    (no schema, xgrammar missing, another backend)."""
    if params.json_schema is None:
        return None, "the request has no JSON schema"
    why = available()
    if why:
        return None, why
    vc = llm.llm_engine.vllm_config
    so = vc.structured_outputs_config
    backend = getattr(so, "backend", "auto")
    if backend not in ("auto", "xgrammar"):
        return None, f"the engine's structured output backend is {backend}, not xgrammar"
    if backend == "auto":  # vLLM's "auto" falls back to guidance for what xgrammar lacks
        from vllm.v1.structured_output import backend_xgrammar as bx

        if bx.has_xgrammar_unsupported_json_features(params.json_schema):
            return None, "vLLM's auto backend uses guidance for this schema, not xgrammar"
    chk = Checker(tokenizer, vc.model_config.get_vocab_size(), params.json_schema,
                  sorted(params.masked_by_min_tokens),
                  bool(getattr(so, "disable_any_whitespace", False)))
    return chk, None


def for_model(path: str, params: contracts.Params, *, disable_any_whitespace: bool = False
              ) -> tuple["Checker | None", str | None, Any]:
    """(the checker, None, the tokenizer) of a request with a JSON schema on a served model whose
    folder (or Hugging Face cache entry) is readable here, compiled as vLLM's xgrammar backend
    compiles it from that folder: the tokenizer, the model's vocabulary size (``config.json``,
    its text config's ``vocab_size``, as ``ModelConfig.get_vocab_size``), the stop ids vLLM
    gives the matcher (``all_stop_token_ids``: the request's stop ids, the tokenizer's EOS and
    ``generation_config.json``'s). (None, why, None) when it cannot be built. Nothing is
    downloaded (``local_files_only``)."""
    if params.json_schema is None:
        return None, "the request has no JSON schema", None
    why = available()
    if why:
        return None, why, None
    try:
        from vllm.v1.structured_output import backend_xgrammar as bx

        if bx.has_xgrammar_unsupported_json_features(params.json_schema):
            return None, "vLLM's auto backend uses guidance for this schema, not xgrammar", None
    except ImportError:  # pragma: no cover - depends on the install
        pass
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
        cfg = _model_json(path, "config.json") or {}
        gen = _model_json(path, "generation_config.json") or {}
    except Exception as e:
        return None, (f"the model's tokenizer is not readable here ({path}: "
                      f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"), None
    text = cfg.get("text_config") or cfg
    vocab = text.get("vocab_size") or cfg.get("vocab_size") or len(tok)
    eos = {int(t) for t in _ids(tok.eos_token_id) + _ids(gen.get("eos_token_id"))}
    chk = Checker(tok, int(vocab), params.json_schema,
                  sorted(set(params.stop_token_ids) | eos), disable_any_whitespace)
    return chk, None, tok


def _ids(v) -> list[int]:
    return [] if v is None else [int(v)] if isinstance(v, int) else [int(t) for t in v]


def _model_json(path: str, name: str) -> dict | None:
    """A JSON file of a model folder, or of its Hugging Face cache entry (no download)."""
    import os

    if os.path.isdir(path):
        f = os.path.join(path, name)
    else:
        from huggingface_hub import try_to_load_from_cache

        f = try_to_load_from_cache(path, name)
        if not isinstance(f, str):
            return None
    if not os.path.isfile(f):
        return None
    with open(f) as fh:
        return json.load(fh)


def reasoning_on(llm) -> bool:
    """Whether vLLM holds the grammar back until the reasoning ends on this engine: a
    reasoning parser is set and ``enable_in_reasoning`` is off."""
    so = llm.llm_engine.vllm_config.structured_outputs_config
    return bool(getattr(so, "reasoning_parser", None)) and \
        not bool(getattr(so, "enable_in_reasoning", False))
