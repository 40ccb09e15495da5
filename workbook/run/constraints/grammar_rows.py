"""A structured output judged by its grammar, from the row check's evidence: the output through
the request's JSON schema compiled as vLLM's xgrammar backend compiles it
(``workbook.vllm.grammar``), and every structured-output row (draft rows included) against what
the grammar allows there (stage ``grammar bitmask``). A sentence cites the token vLLM emitted
where it holds the row's maximum and says a tie as a tie. Not here: the cells
(``cases.judge_request`` calls it).
"""

from __future__ import annotations

from workbook.core import contracts


def grammar_evidence(engine, rc, req: str, output: list[int]):
    """For a request with a JSON schema: the output through its grammar
    (``contracts.GrammarTruth``), why there is none (a sentence, else None), and the row
    breaches — per structured-output row (draft rows included), the grammar advanced through
    the committed output + the row's drafts ``[:j]`` from where vLLM starts it
    (``grammar.grammar_start``: after the reasoning) must allow the processed row's argmax,
    and the row may hold no more finite columns than the grammar allows (+1: the budget's
    forced column). Rows before the grammar starts, after it ended, or after a draft it
    rejects are not judged by it (vLLM does not constrain them or never emits them); nor are
    rows vLLM samples nothing from or whose token it never returns
    (``contracts.grammar_bound_rows``)."""
    p = rc.params[req]
    if p.json_schema is None:
        return None, None, []
    if engine is None:
        return None, "no engine to build the grammar on", []
    from workbook.vllm import grammar as vgrammar

    if hasattr(engine, "grammar_for"):  # a served engine: from the folder it loaded
        chk, why, reasoning = engine.grammar_for(p)
    else:
        chk, why = vgrammar.for_request(engine.llm, engine.tokenizer, p)
        reasoning = vgrammar.reasoning_on(engine.llm) if chk is not None else False
    if chk is None:
        return None, why, []
    prompt = rc.prompts[req]
    truth = chk.truth(prompt, output, rc.markers, reasoning)
    rows: list[dict] = []
    committed: list[int] = []
    for rec, bound in contracts.grammar_bound_rows(rc.steps, req, len(output)):
        for row in bound:
            j = row["local_pos"]
            seen = committed + [int(t) for t in row["drafts"][:j]]
            start = vgrammar.grammar_start(prompt, seen, rc.markers, reasoning)
            if start is None or start > len(seen):
                continue
            mask = chk.allowed_mask(seen[start:])
            if mask is None:
                continue
            top1, n_allowed = int(row["top1"]), int(mask.sum())
            limit = n_allowed + (1 if p.thinking_token_budget is not None else 0)
            ok = lambda c: 0 <= c < len(mask) and bool(mask[c])
            t = row.get("emitted_token")
            # the token vLLM emitted, where it holds the row's maximum (the workbook's own
            # top-k order on a tie is not vLLM's argmax)
            at_max = t is not None and row.get("proc_at_emitted") is not None and \
                contracts.close(row["proc_at_emitted"], row["top1_val"])
            cited = int(t) if at_max else top1
            tie = contracts.close(row["top1_val"], row["top2_val"])
            after = f"after {len(seen) - start} grammar token(s) ({n_allowed} allowed)"
            what = None
            if not ok(cited):
                what = (f"the processed row's argmax {cited}"
                        + (" (the token vLLM emitted)" if at_max else "")
                        + (f" (a tie at {row['top1_val']:.6g})" if tie else "")
                        + f" is not allowed by the grammar {after}")
            elif not ok(top1):
                what = (f"column {top1} holds the row's maximum {row['top1_val']:.6g}, tied with "
                        f"the emitted {cited}, and is not allowed by the grammar {after}")
                cited = top1
            elif row.get("finite") is not None and row["finite"] > limit:
                what = (f"{row['finite']} finite columns, the grammar allows {n_allowed} after "
                        f"{len(seen) - start} grammar token(s)")
            if what:
                rows.append({"step": rec["step"], "row": row["row"], "local_pos": j,
                             "stage": "grammar bitmask", "contract": "structured_output",
                             "what": what, "column": cited, "out_index": len(seen),
                             "source": "own"})
                break
        committed += [int(t) for t in rec["emitted"]]
    return truth, None, rows
