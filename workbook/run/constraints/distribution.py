"""The distribution oracle (issue 30, brief §10.2): under temperature > 0 a constraint and
speculative decoding must leave the *distribution* of every sampled token as vLLM promises —
a masked token never sampled, every other one with probability softmax(processed row / T),
the processed row being what the contracts (``workbook.core.contracts.expected``) predict, and
the same distribution with speculation as without ("lossless": vLLM's docs). A defect that
changes a distribution but not the argmax (a rejection step on the wrong probabilities, a
temperature applied twice or skipped on draft rows) is invisible to the greedy row check,
output check and differential; this is the fourth oracle.

The model: a real engine on a tiny model with two weight edits (``known_model``, restored on
exit): every token embedding set to one row, so every position of every sequence has the same
hidden state (attention over identical values returns that value) — the target's raw logits
are the same vector at every position whatever the context; then the ``lm_head`` (shared by
MTP's drafter) set to ``TARGET_LOGITS`` h^T / |h|^2 for that state h, so the target's raw logits
are exactly ``TARGET_LOGITS``: a concentrated, known distribution (8 hot tokens, the rest of the
vocabulary one "other" category). MTP's drafter states are nearly orthogonal to h, so its
logits are a small multiple of the same row and it drafts the target's most likely token
(accepted about a third of the time at T = 0.8). (Solving the drafter's logits independently
needs a component ~1e4 times larger than h's, which the CPU's reduced-precision float32 GEMM
turns into errors of several logits: measured, not used.) The
raw row is read back through vLLM's own ``raw_logits`` logprobs (``calibration``) and the
prediction is built from what vLLM returned, not from what was asked for.

The tests (pure statistics, scipy.stats; no engine): per case × method × position,
- ``contract``: the empirical token counts vs the expected counts sum_i softmax(expected row_i
  / T) (history-dependent rows — penalties — predicted per sample from its own prefix);
  categories with an expected count below ``MIN_EXPECTED`` pooled into "other"; Pearson's
  chi-square (``scipy.stats.chisquare``; with per-sample rows the statistic is dominated by the
  identical-rows one, so the test is conservative). A sampled token whose predicted
  probability is 0 (masked) is a violation by itself (``masked``), no statistics needed.
- ``spec vs none``: the two samples' counts at the position (and of adjacent pairs, position
  t-1 and t: losslessness is about the joint distribution) in a contingency table,
  ``scipy.stats.chi2_contingency`` (pooled the same way).
Multiple testing: Holm–Bonferroni (``holm``) over every p-value of one cell (positions × tests)
at ``ALPHA`` = 0.01: a healthy cell is flagged with probability at most 0.01, whatever its
number of positions; a batch of C cells at most C × 0.01 (the batch's Holm over all cells is
reported too).

Command: ``python -m workbook.run.constraints.distribution --out DIR [--methods none,mtp,ngram] [--cases
...] [--samples N] [--temperature T] [--fault NAME] [--repeats R]`` writes ``distribution.json``
(per cell: p-values per position, samples, samples/s, wall time, verdict) into a fresh folder;
bad input is one line and rc 2 before any engine starts.

Not here: the statistics (``workbook.run.constraints.diststats``), the contracts
(``workbook.core.contracts``), the faults (``workbook.hooks.faults.constraints``).
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from workbook.core import budget, contracts
from workbook.core.config import ConfigError
from workbook.core.models import VOCAB

# the hot tokens of the known model: BPE merges of the tiny tokenizer that are whole words, each
# its own text's only token (so a bad word given as text, as vLLM takes it, bans exactly it)
HOT = (256, 257, 259, 260, 273, 275, 277, 279)
# the embedding row every token gets (its hidden state h is the one of every position). It
# decides the drafter's premise, not the hot ids: MTP's drafter state has a small positive
# component along this h (cosine 0.09), so its logits are a positive multiple of the target's
# row and it drafts the target's most likely token; row 256's h gives a drafter whose drafts are
# never accepted (measured on the H100: no draft row beyond the first was ever verified, so
# ``draft-rows-untempered`` changed nothing)
EMBED_ROW = 100
TARGET_LOGITS = {t: 7.5 - 0.5 * i for i, t in enumerate(HOT)}  # the rest of the vocabulary: 0
METHODS = ("none", "mtp", "ngram")
# the cases: SamplingParams keywords beyond temperature / seed / max_tokens
CASES = {
    "unconstrained": {},
    "allowed_token_ids": {"allowed_token_ids": [HOT[0], HOT[1], HOT[3], HOT[6], 7]},
    "bad_words": {"bad_words": [[HOT[0]]]},  # token ids; sent as their text (``sampling_kwargs``)
    "penalties": {"presence_penalty": 0.6, "frequency_penalty": 0.4, "repetition_penalty": 1.3},
    "logit_bias": {"logit_bias": {HOT[5]: 3.0, HOT[0]: -2.0}},
    # the budget under sampling (vLLM #54906's constraint): the prompt ends in the start marker,
    # 2 reasoning tokens are sampled freely, then the end marker is forced (p = 1) whatever was
    # sampled or drafted, and the positions after it are free again
    "thinking_token_budget": {"thinking_token_budget": 2},
}
PROMPT = [HOT[0], HOT[1], HOT[0], HOT[2], HOT[0], HOT[1], HOT[3], HOT[0], HOT[1]]


def prompt_of(case: str, markers=None) -> list[int]:
    """The case's prompt: ``PROMPT``, opened reasoning (+ the start marker) for the budget.
    (Every embedding is the same row in the known model: the prompt changes no logit.)"""
    if CASES[case].get("thinking_token_budget") is not None:
        if markers is None or not markers.complete:
            raise ConfigError(f"case {case!r} needs the engine's reasoning markers (start and "
                              "end); this engine has none")
        return PROMPT + list(markers.start)
    return list(PROMPT)


# the statistics (no engine) live in ``diststats``; re-exported: one import for the batch's users
from workbook.run.constraints.diststats import (ALPHA, MIN_EXPECTED, Predictor, counts,  # noqa: E402,F401
                                    describe, expected_counts, gof, holm, judge_cell, pooled,
                                    softmax, two_sample)


# ------------------------------------------------------------------ the known model (engine)

def _modules(runner, suffix: str) -> list:
    mods, seen = [], set()
    for model in (getattr(runner, "model", None),
                  getattr(getattr(runner, "speculator", None), "model", None)):
        if model is None:
            continue
        for name, mod in model.named_modules():
            if name.endswith(suffix) and hasattr(mod, "weight") and id(mod) not in seen:
                seen.add(id(mod))
                mods.append(mod)
    return mods


def _head_of(model):
    return next((m for n, m in model.named_modules() if n.endswith("lm_head")), None)


class known_model:
    """Context manager on a started engine: every embedding row set to row ``EMBED_ROW``'s (one
    hidden state at every position), then each ``lm_head`` solved so the target's raw logits
    are ``TARGET_LOGITS`` (the drafter shares it); the weights are restored on exit.
    ``self.premise``: the largest spread of the hidden states seen (relative), which must be
    ~0 for the prediction to hold."""

    def __init__(self, engine):
        self.engine = engine
        self.premise = None

    def __enter__(self):
        import torch

        from workbook.vllm import lmhead

        runner = self.engine.runner
        self.embeds = _modules(runner, "embed_tokens")
        self.heads = _modules(runner, "lm_head")
        self.saved = [m.weight.detach().clone() for m in self.embeds + self.heads]
        with torch.no_grad():
            for m in self.embeds:
                m.weight.copy_(m.weight[EMBED_ROW].expand_as(m.weight))
        h = self._hidden_state()
        target = np.zeros(VOCAB)
        for t, v in TARGET_LOGITS.items():
            target[t] = v
        with torch.no_grad():
            for head in self.heads:
                # W h = target exactly (W = target h^T / |h|^2); the drafter's states, nearly
                # orthogonal to h, get a small multiple of the target's row: its argmax
                W = np.outer(target, h / float(h @ h))
                head.weight.copy_(torch.as_tensor(W, dtype=head.weight.dtype,
                                                  device=head.weight.device))
                lmhead.repack(head)
            # compute_logits normalises the state it receives (the final norm) before the
            # head: the logits are target * (a . g) for the normalised state g; rescale once
            got = runner.model.compute_logits(torch.as_tensor(
                h[None], dtype=torch.float32, device=self.heads[0].weight.device))
            c = float(got[0, HOT[0]]) / TARGET_LOGITS[HOT[0]]
            for head in self.heads:
                head.weight.div_(c)
                lmhead.repack(head)
        return self

    def _hidden_state(self) -> np.ndarray:
        """Run one short request and return the hidden state the target's ``compute_logits``
        received (their mean; ``self.premise``: their largest relative spread)."""
        model = self.engine.runner.model
        got: list = []
        orig = model.compute_logits

        def capture(hidden_states, *a, **k):
            got.append(hidden_states.detach().float().cpu().numpy().copy())
            return orig(hidden_states, *a, **k)

        model.compute_logits = capture
        try:
            from vllm import SamplingParams

            self.engine.llm.generate([{"prompt_token_ids": PROMPT}],
                                     SamplingParams(temperature=0, max_tokens=6,
                                                    ignore_eos=True), use_tqdm=False)
        finally:
            del model.compute_logits
        rows = np.concatenate([g.reshape(-1, g.shape[-1]) for g in got])
        self.premise = float(np.abs(rows - rows[0]).max() / np.abs(rows[0]).max())
        return rows.astype(np.float64).mean(0)

    def __exit__(self, *exc):
        import torch

        from workbook.vllm import lmhead

        with torch.no_grad():
            for m, w in zip(self.embeds + self.heads, self.saved):
                m.weight.copy_(w)
            for h in self.heads:
                lmhead.repack(h)
        return False


def engine_config(method: str, max_num_seqs: int = 64, k: int = 3):
    """The grid's engine configuration of ``method`` (``environments/constraints.yaml``) with
    room for ``max_num_seqs`` sequences, float32 weights (the solved ``lm_head`` in bfloat16
    would round the target's logits by ~1) and vLLM's raw logits returned as logprobs (the
    calibration reads the raw row back; sampling does not depend on ``logprobs_mode``)."""
    from workbook.run.constraints import grid as G

    cfg = G.config_for(method, k=k)
    return cfg.replace(max_num_seqs=max_num_seqs, dtype="float32", engine_kwargs={
        **cfg.engine_kwargs, "logprobs_mode": "raw_logits", "max_logprobs": VOCAB,
        "disable_log_stats": False})  # vLLM's speculative-decoding counters (``spec_counters``)


SPEC_METRICS = {"vllm:spec_decode_num_drafts": "drafts",
                "vllm:spec_decode_num_draft_tokens": "draft_tokens",
                "vllm:spec_decode_num_accepted_tokens": "accepted",
                "vllm:spec_decode_num_accepted_tokens_per_pos": "accepted_per_pos"}


def spec_counters(engine) -> dict:
    """vLLM's own speculative-decoding counters (``LLM.get_metrics``): drafts, draft tokens,
    accepted tokens, accepted per draft position. Empty without speculation. A draft-row fault
    can only show where drafts beyond the first position were verified (accepted_per_pos[0] >
    0), so each cell records how far its drafts reached."""
    out: dict = {}
    try:
        for m in engine.llm.get_metrics():
            key = SPEC_METRICS.get(m.name)
            if key:
                out[key] = list(m.values) if key == "accepted_per_pos" else int(m.value)
    except Exception:  # metrics off or another vLLM: no counters, said as such
        return {}
    return out


def counters_delta(before: dict, after: dict) -> dict:
    return {k: ([a - b for a, b in zip(v, before.get(k, [0] * len(v)))] if isinstance(v, list)
                else v - before.get(k, 0)) for k, v in after.items()}


def calibration(engine, positions: int = 4) -> dict:
    """The target's raw logits as vLLM returns them (``raw_logits``, every column) at
    ``positions`` greedy positions of the known model: the row the prediction uses (their
    mean) and the largest difference between positions (the premise: one row everywhere)."""
    from vllm import SamplingParams

    out = engine.llm.generate([{"prompt_token_ids": PROMPT}], SamplingParams(
        temperature=0, max_tokens=positions, ignore_eos=True, logprobs=VOCAB),
        use_tqdm=False)[0].outputs[0]
    rows = []
    for d in out.logprobs:
        r = np.zeros(VOCAB)
        for t, lp in d.items():
            r[int(t)] = float(getattr(lp, "logprob", lp))
        rows.append(r)
    rows = np.stack(rows)
    want = np.zeros(VOCAB)
    for t, v in TARGET_LOGITS.items():
        want[t] = v
    return {"raw": rows.mean(0), "spread": float(np.abs(rows - rows[0]).max()),
            "vs_designed": float(np.abs(rows.mean(0) - want).max()), "tokens": list(out.token_ids)}


def sampling_kwargs(case: str, decode=None) -> dict:
    """The case's ``SamplingParams`` keywords; ``bad_words`` (token ids in ``CASES``) as the
    strings vLLM takes, ``decode(ids) -> str`` (the engine's tokenizer)."""
    kw = dict(CASES[case])
    if "bad_words" in kw:
        if decode is None:
            raise ConfigError(f"case {case!r}: bad words are strings; a tokenizer is needed")
        kw["bad_words"] = [decode(list(w)) for w in kw["bad_words"]]
    return kw


def _decode(engine):
    tok = engine.llm.get_tokenizer()
    return lambda ids: tok.decode(ids)


def sample(engine, case: str, *, n: int, seed0: int, temperature: float, max_tokens: int,
           prompt: list[int] | None = None) -> tuple[list[list[int]], float, str | None]:
    """``n`` samples of ``case`` (seeds ``seed0`` .. ``seed0 + n - 1``, one request each, in
    one ``generate`` call: vLLM batches them up to ``max_num_seqs``). Returns the token lists,
    the wall time, and vLLM's message when it refused the request (no samples)."""
    from vllm import SamplingParams

    from workbook.run.constraints.cases import one_line

    try:
        kw = sampling_kwargs(case, _decode(engine))  # once: the same keywords for every sample
        sps = [SamplingParams(temperature=temperature, seed=seed0 + i, max_tokens=max_tokens,
                              ignore_eos=True, **kw) for i in range(n)]
    except Exception as e:
        return [], 0.0, one_line(e)
    t0 = time.perf_counter()
    try:
        outs = engine.llm.generate([{"prompt_token_ids": list(prompt or PROMPT)}] * n, sps,
                                   use_tqdm=False)
    except Exception as e:
        return [], time.perf_counter() - t0, one_line(e)
    return [[int(t) for t in o.outputs[0].token_ids] for o in outs], \
        time.perf_counter() - t0, None


def params_of(engine, case: str, temperature: float) -> contracts.Params:
    """The case's contract parameters as vLLM's engine holds them (bad words: the token id
    sequences vLLM derives from the strings, ``update_from_tokenizer``)."""
    from vllm import SamplingParams

    sp = SamplingParams(temperature=temperature, max_tokens=8, ignore_eos=True,
                        **sampling_kwargs(case, _decode(engine)))
    if sp.bad_words:
        sp.update_from_tokenizer(engine.llm.get_tokenizer())
    return contracts.Params.of(sp)


# ------------------------------------------------------------------ the batch and its command

@dataclass
class Plan:
    methods: list
    cases: list
    faults: list  # constraint faults run on the spec methods (case: fault_cases)
    fault_cases: list
    samples: int = 256
    temperature: float = 0.8
    positions: int = 4
    seed: int = 0
    max_num_seqs: int = 128
    repeats: int = 1


def plan(methods="none,mtp", cases="unconstrained", faults="", fault_cases="unconstrained",
         samples=256, temperature=0.8, positions=4, seed=0, max_num_seqs=128,
         repeats=1) -> Plan:
    """The batch asked for; ``ConfigError`` naming any bad value (before an engine starts)."""
    from workbook.core import constraint_fault_catalogue as cat

    split = lambda v: [x for x in (v.split(",") if isinstance(v, str) else v) if x]
    p = Plan(split(methods), split(cases), split(faults), split(fault_cases), int(samples),
             float(temperature), int(positions), int(seed), int(max_num_seqs), int(repeats))
    for what, got, known in (("method", p.methods, METHODS), ("case", p.cases, CASES),
                             ("case", p.fault_cases, CASES),
                             ("fault", p.faults, cat.FAULTS)):
        bad = [x for x in got if x not in known]
        if bad:
            raise ConfigError(f"{what} {bad[0]!r} is unknown; known: {', '.join(known)}")
    if "none" not in p.methods:
        p.methods.insert(0, "none")  # the two-sample tests' reference
    p.methods = ["none"] + [m for m in p.methods if m != "none"]
    if not 0 < p.temperature <= 2:
        raise ConfigError(f"temperature={p.temperature!r}: the distribution test needs "
                          "0 < temperature <= 2 (temperature 0 is greedy: the grid's)")
    if p.temperature == 1.0 and p.faults:
        raise ConfigError("temperature=1.0: vLLM skips the temperature step at 1, so the "
                          "temperature faults do nothing there; use e.g. 0.8")
    for name, v, lo in (("samples", p.samples, 20), ("positions", p.positions, 1),
                        ("max_num_seqs", p.max_num_seqs, 1), ("repeats", p.repeats, 1)):
        if v < lo:
            raise ConfigError(f"{name}={v}: must be >= {lo}")
    return p


@dataclass
class Cell:
    case: str
    method: str
    fault: str
    repeat: int
    status: str  # holds | violated | refused | error
    message: str = ""
    samples: int = 0
    wall_s: float = 0.0
    samples_per_s: float = 0.0
    tests: list = field(default_factory=list)
    min_p: float | None = None
    seeds: list = field(default_factory=list)  # first and last seed
    spec: dict = field(default_factory=dict)  # vLLM's spec-decoding counters over the cell


def n_cells(p: Plan) -> int:
    """The cells ``p`` runs: cases per method (and fault cases on the spec methods), repeated."""
    return p.repeats * sum(len(p.cases) + (len(p.faults) * len(p.fault_cases)
                                           if m != "none" else 0) for m in p.methods)


def run(p: Plan, out: str, log=print, progress=None) -> dict:
    """Every cell of ``p``, one engine per method (``none`` first: the reference samples,
    seeds disjoint from the spec cells'); writes ``out/distribution.json`` after each cell.
    ``progress`` (``workbook.core.progress.Progress`` over the cells): each step (engine start,
    calibration, sampling) and each cell's line (else the line goes to ``log``)."""
    import json

    from workbook.vllm import engine as vengine

    def step(text):
        if progress is not None:
            progress.step(text)

    os.makedirs(out, exist_ok=True)
    res: dict = {"plan": asdict(p), "alpha": ALPHA, "cells": [], "engines": {}}
    reference: dict = {}
    t_all = time.perf_counter()

    def save():
        res["wall_s"] = round(time.perf_counter() - t_all, 1)
        with open(os.path.join(out, "distribution.json"), "w") as f:
            json.dump(res, f, indent=1, default=str)

    for method in p.methods:
        t0 = time.perf_counter()
        step(f"{method}: starting the engine")
        eng = vengine.start(engine_config(method, p.max_num_seqs),
                            log=os.path.join(out, f"engine-{method}.log"))
        res["engines"][method] = {"start_s": round(time.perf_counter() - t0, 1)}
        res["vllm_version"] = eng.effective.get("vllm_version")  # vLLM imported only now
        try:
            # after the engine start: its process environment (the CPU shim's Triton
            # interpreter) must be in place before vLLM's kernels are imported
            from workbook.hooks.faults import constraints as constraint_faults

            markers = budget.Markers.of(eng.effective)
            with known_model(eng) as km:
                step(f"{method}: calibration (the raw row read back)")
                cal = calibration(eng)
                res["engines"][method].update(premise=km.premise, calibration_spread=cal[
                    "spread"], calibration_vs_designed=cal["vs_designed"])
                runs = [(c, "none") for c in p.cases]
                if method != "none":
                    runs += [(c, f) for f in p.faults for c in p.fault_cases]
                for case, fault in runs:
                    for r in range(p.repeats):
                        seed0 = p.seed + r * p.samples + (10 ** 6 if method == "none" else 0)
                        ps = constraint_faults.inject(fault) if fault != "none" else None
                        c0 = spec_counters(eng) if method != "none" else {}
                        step(f"{method} {case} fault={fault} rep {r}: {p.samples} samples")
                        try:
                            prompt = prompt_of(case, markers)
                            outs, wall, msg = sample(eng, case, n=p.samples, seed0=seed0,
                                                     temperature=p.temperature,
                                                     max_tokens=p.positions, prompt=prompt)
                        finally:
                            if ps is not None:
                                ps.remove()
                        cell = Cell(case, method, fault, r, "refused" if msg else "holds",
                                    msg or "", len(outs), round(wall, 1),
                                    round(len(outs) / wall, 2) if wall else 0.0,
                                    seeds=[seed0, seed0 + p.samples - 1],
                                    spec=counters_delta(c0, spec_counters(eng))
                                    if method != "none" else {})
                        if outs:
                            if method == "none":
                                reference[(case, r)] = outs
                            pred = Predictor(params_of(eng, case, p.temperature), cal["raw"],
                                             prompt, markers)
                            ref = reference.get((case, r)) if method != "none" else None
                            j = judge_cell(outs, pred, ref)
                            cell.status, cell.tests, cell.min_p = j["verdict"], j["tests"], \
                                j["min_p"]
                            cell.message = describe(j["first"])
                        res["cells"].append(asdict(cell))
                        acc = cell.spec.get("accepted_per_pos")
                        reach = (f"; drafts {cell.spec.get('drafts', 0)}, accepted per position "
                                 f"{acc}") if acc is not None else ""
                        line = (f"{method:5s} {case:18s} fault={fault:24s} rep {r}: "
                                f"{cell.status} ({cell.message}); {cell.samples} samples, "
                                f"{cell.samples_per_s} samples/s{reach}")
                        if progress is not None:
                            progress.done(line)
                        else:
                            log(line, flush=True)
                        save()
        finally:
            eng.shutdown()
            del eng
    save()
    return res


def main(argv=None) -> int:
    """The command; exit codes as the grid's (``commandline.EXIT_CODES``): 0 every cell held, 1 a
    cell violated, 2 bad input (one line, before any engine), 3 no violation but a cell
    errored, 130 Ctrl-C (one line; ``distribution.json`` keeps the cells finished)."""
    import argparse

    from workbook.core import constraint_fault_catalogue as cat
    from workbook.core import progress as wprogress
    from workbook.run.constraints.commandline import EXIT_CODES, exit_code

    ap = argparse.ArgumentParser(
        prog="python -m workbook.run.constraints.distribution",
        description="The distribution oracle: under temperature > 0, each constraint and each "
                    "speculative method must leave every sampled token's distribution as "
                    "vLLM promises (chi-square vs the contracts' rows, and spec vs none; Holm "
                    "per cell at alpha 0.01). docs/distribution.md", epilog=EXIT_CODES)
    ap.add_argument("--out", required=True, help="a new folder for distribution.json "
                                                 "(never overwritten)")
    ap.add_argument("--methods", default="none,mtp",
                    help=f"comma-separated, of {', '.join(METHODS)} (none always runs: the "
                         "reference; default none,mtp)")
    ap.add_argument("--cases", default="unconstrained",
                    help=f"comma-separated, of {', '.join(CASES)} (default unconstrained)")
    ap.add_argument("--faults", default="",
                    help="distribution faults run on the spec methods, comma-separated, of "
                         f"{', '.join(cat.FAULTS)} (default: none)")
    ap.add_argument("--fault-cases", default="unconstrained",
                    help="the cases the faults run on (same names as --cases; default "
                         "unconstrained)")
    ap.add_argument("--samples", type=int, default=256,
                    help="samples per cell, each with its own seed (>= 20; default 256)")
    ap.add_argument("--temperature", type=float, default=0.8,
                    help="0 < T <= 2 (default 0.8; at 1.0 vLLM skips the temperature step)")
    ap.add_argument("--positions", type=int, default=4,
                    help="output positions tested per sample (>= 1; default 4)")
    ap.add_argument("--seed", type=int, default=0, help="the first seed (default 0)")
    ap.add_argument("--max-num-seqs", type=int, default=128,
                    help="the engine's max_num_seqs: samples sent at once (default 128)")
    ap.add_argument("--repeats", type=int, default=1,
                    help="each cell repeated with fresh seeds (false-alarm rate; default 1)")
    wprogress.add_arguments(ap)
    a = ap.parse_args(argv)
    try:
        if os.path.exists(os.path.join(a.out, "distribution.json")):
            raise ConfigError(f"--out {a.out}: holds a distribution.json already (runs never "
                              "overwrite)")
        p = plan(a.methods, a.cases, a.faults, a.fault_cases, a.samples, a.temperature,
                 a.positions, a.seed, a.max_num_seqs, a.repeats)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        with wprogress.Progress(n_cells(p), "distribution", wprogress.enabled(a.progress),
                                unit="cell") as bar:
            res = run(p, a.out, progress=bar)
    except KeyboardInterrupt:
        print(f"\nworkbook: interrupted (Ctrl-C); {os.path.join(a.out, 'distribution.json')} "
              "keeps the cells finished so far", file=sys.stderr)
        return 130
    return exit_code("ok", res["cells"])


if __name__ == "__main__":
    sys.exit(main())
