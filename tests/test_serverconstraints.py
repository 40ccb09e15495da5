"""``workbook check-server --constraints`` judged without a server: the verdict of one case from
what a server returned (``serverconstraints.judge`` / ``row_breaches``), and the one-line error
for an unknown constraint name before any request. The real server's run is in
``tests/test_servercheck.py`` (the ``workbook serve`` test)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from workbook.core.budget import Markers
from workbook.run.servers import constraints as S

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MK = Markers((10,), (11,))
PROMPT = [1, 10, 2]  # reasoning open, one reasoning token


def _sent(output, tops=None, finish="length", text=None):
    return S.Sent({}, PROMPT, list(output), finish, text, tops or [{} for _ in output], None,
                  None)


def _rows_judged(v, mode):
    """(columns, positions) of the verdict's "processed rows vs the control" line."""
    for j in v.judged:
        m = re.fullmatch(rf"processed rows vs the control \({mode}: (\d+) columns at (\d+) "
                         r"positions\)", j)
        if m:
            return int(m.group(1)), int(m.group(2))
    return None


def _judge(name, kw, case, control=None, mode="processed_logprobs"):
    p = S._params(kw, [], mode)
    return S.judge(name, kw, p, case, control, MK, mode, None)


def test_stop_token_then_more_tokens_is_violated():
    v = _judge("stop", {"stop_token_ids": [7], "ignore_eos": False}, _sent([5, 7, 8, 9]))
    assert v.status == "violated" and v.first["contract"] == "stop"
    assert v.first["out_index"] == 2 and "stop token 7 at index 1" in v.first["what"]


def test_allowed_token_ids_emitted_outside_is_violated():
    v = _judge("allowed_token_ids", {"allowed_token_ids": [5, 6]}, _sent([5, 9]))
    assert v.status == "violated" and v.first["out_index"] == 1


def test_budget_end_marker_missing_is_violated_and_emitted_holds():
    # budget 1, one reasoning token in the prompt: </think> (11) due at output index 0
    assert _judge("thinking_token_budget", {"thinking_token_budget": 1},
                  _sent([11, 3])).status == "holds"
    v = _judge("thinking_token_budget", {"thinking_token_budget": 1}, _sent([3, 3]))
    assert v.status == "violated" and v.first["contract"] == "thinking_token_budget"
    assert v.first["out_index"] == 0


def test_min_tokens_rows_shift_against_the_control():
    """processed_logprobs: the min_tokens mask must hold the stop column at the clamp while
    index < min_tokens; the control (same prompt, no constraint) gives the raw row."""
    kw = {"min_tokens": 2, "stop_token_ids": [7]}
    control = _sent([5, 5], [{5: -1.0, 7: -2.0, 9: -3.0}, {5: -1.0, 7: -2.0, 9: -3.0}])
    masked = _sent([5, 5], [{5: -0.8, 7: -9999.0, 9: -2.8}, {5: -0.8, 7: -9999.0, 9: -2.8}])
    assert _judge("min_tokens", kw, masked, control).status == "holds"
    leaked = _sent([5, 5], [{5: -0.8, 7: -9999.0, 9: -2.8}, {5: -1.0, 7: -2.0, 9: -3.0}])
    v = _judge("min_tokens", kw, leaked, control)
    assert v.status == "violated" and v.first["column"] == 7 and v.first["out_index"] == 1


def test_row_contract_in_raw_mode_is_not_judged_and_says_why():
    kw = {"repetition_penalty": 1.5, "presence_penalty": -0.5}
    v = _judge("penalties", kw, _sent([5, 5]), _sent([5, 5]), mode="raw")
    assert v.status == "not judged" and "raw logprobs" in v.message


def test_unknown_constraint_is_one_line_rc2_before_any_request():
    proc = subprocess.run([sys.executable, "-m", "workbook.cli", "check-server",
                           "http://127.0.0.1:1", "--constraints", "stop,nope"],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": REPO},
                          cwd=REPO, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    line = proc.stderr.strip()
    assert len(line.splitlines()) == 1 and "'nope' unknown" in line and "stop_strings" in line
    with pytest.raises(S.UnknownConstraint):
        S.parse_names("stop,,nope")
    assert S.parse_names("all") == list(S.C.CONSTRAINTS)


# --- the grammar over a server: the structured-output contract's own check on GrammarTruth ------

class _Endpoint:
    """The server's answers as dicts of the shape vLLM's OpenAI server returns (``/v1/models``,
    ``/tokenize``, ``/v1/completions``), keyed by path; records every request body."""

    def __init__(self, root, tokenize=None, complete=None):
        self.root, self.tokenize, self.complete, self.bodies = root, tokenize, complete, []

    def get(self, path):
        assert path == "/v1/models"
        return {"data": [{"id": "m", "root": self.root}]}

    def post(self, path, body):
        self.bodies.append((path, body))
        if path == "/tokenize":
            return {"tokens": self.tokenize(body["prompt"])}
        return self.complete(body)


@pytest.fixture(scope="module")
def tiny():
    pytest.importorskip("xgrammar")
    from transformers import AutoTokenizer

    from workbook.core import models

    root = models.build("tiny-mimo-mtp")
    return root, AutoTokenizer.from_pretrained(root)


SCHEMA_KW = {"structured_outputs": {"json": S.contracts.JSON_SCHEMA}}
NO_THINK = [1, 368, 198, 369, 198]  # the prompt ends the reasoning: the grammar binds at 0
THINK = Markers((368,), (369,))  # the tiny tokenizer's <think> / </think>


def _grammar_verdict(tiny, text, finish, *, tokenize=None, eos=False):
    root, tok = tiny
    out = tok.encode(text, add_special_tokens=False) + ([tok.eos_token_id] if eos else [])
    case = S.Sent({}, NO_THINK, out, finish, text, [{} for _ in out], None, None)
    ep = _Endpoint(root, tokenize or (lambda s: tok.encode(s, add_special_tokens=False)))
    p = S._params(SCHEMA_KW, [], "processed_logprobs")
    g, why, _ = S.grammar_evidence(ep, "m", p, case, THINK)
    return S.judge("structured_output", SCHEMA_KW, p, case, None, THINK,
                   "processed_logprobs", None, grammar=g, no_grammar=why), g, out


@pytest.mark.parametrize("text,finish,eos,status,where", [
    ('{"a":-100', "length", False, "holds", None),  # cut by max_tokens: a valid prefix holds
    ('{"a":1}', "stop", True, "holds", None),  # EOS where the JSON ends: complete
    ('{"a":1}}', "length", False, "violated", "}"),  # the second "}" is rejected
    ('{"b":1', "length", False, "violated", "b"),  # a key the schema does not allow
    ('{"a":1', "stop", True, "violated", "<|im_end|>"),  # EOS where the JSON cannot end
    ('{"a":1', "stop", False, "violated", None),  # stopped (a stop string) before the end
])
def test_grammar_on_served_output(tiny, text, finish, eos, status, where):
    v, g, out = _grammar_verdict(tiny, text, finish, eos=eos)
    assert v.status == status, v
    assert "the output through the grammar (xgrammar, the model's tokenizer)" in v.judged
    assert g.start == 0 and "structured_output" not in v.not_judged
    if status == "violated":
        f = v.first
        assert f["contract"] == "structured_output"
        if where is not None:  # the first rejected token, at its output index
            i = f["out_index"]
            got = tiny[1].decode(out[i:i + 1], skip_special_tokens=False)
            assert got in (where, '"' + where, where + '"')
            assert "rejected by the grammar" in f["what"]
        else:
            assert "not at its end" in f["what"] and f["out_index"] == len(out)


def test_grammar_not_the_servers_tokenizer_is_not_judged(tiny):
    v, g, _ = _grammar_verdict(tiny, '{"a":-100', "length", tokenize=lambda s: [1, 2, 3])
    assert g is None and v.status == "not judged"
    assert "not the server's tokenizer" in v.message and "ended by length" in v.message


def test_grammar_unreadable_model_folder_says_why(tmp_path):
    pytest.importorskip("xgrammar")
    case = S.Sent({}, NO_THINK, [90], "length", "{", [{}], None, None)
    p = S._params(SCHEMA_KW, [], "raw")
    g, why, _ = S.grammar_evidence(_Endpoint(str(tmp_path / "nowhere")), "m", p, case, MK)
    assert g is None and "not readable here" in why


# --- penalties per position: processed_logits (all three), processed_logprobs (additive) --------

PEN = {"repetition_penalty": 1.5, "presence_penalty": -0.5, "frequency_penalty": -0.3}
RAW = {5: 2.0, 6: -1.0, 9: 0.5}  # the raw row at every position (the control's)


def _penalised_rows(p, output, raw=RAW):
    """The processed rows the contract expects: ``contracts.expected`` per position."""
    from workbook.core.contracts import RowContext, expected

    return [{c: expected(p, RowContext(tuple(PROMPT), tuple(output[:i]), markers=MK), c,
                         x).value for c, x in raw.items()} for i in range(len(output))]


def test_penalties_processed_logits_per_position():
    out = [5, 5, 6]
    p = S._params(PEN, [], "processed_logits")
    rows = _penalised_rows(p, out)
    control = _sent(out, [dict(RAW) for _ in out])
    v = _judge("penalties", PEN, _sent(out, rows), control, mode="processed_logits")
    assert v.status == "holds" and _rows_judged(v, "processed_logits") == (9, 3)
    # the repetition penalty not applied at output index 1 (5 emitted once: 2.0/1.5 + 0.5 + 0.3)
    bad = [dict(r) for r in rows]
    bad[1][5] = 2.0 + 0.5 + 0.3
    v = _judge("penalties", PEN, _sent(out, bad), control, mode="processed_logits")
    assert v.status == "violated" and v.first["out_index"] == 1 and v.first["column"] == 5
    assert v.first["contract"] == "penalties"


def _logprobs(row):
    import math

    z = math.log(sum(math.exp(x) for x in row.values()) + 4000)  # the rest of the vocabulary
    return {c: x - z for c, x in row.items()}


def test_penalties_processed_logprobs_additive_judged_repetition_not():
    out = [5, 5, 6]
    add = {k: v for k, v in PEN.items() if k != "repetition_penalty"}
    pa = S._params(add, [], "processed_logprobs")
    control = _sent(out, [_logprobs(RAW) for _ in out])
    rows_case = _sent(out, [_logprobs(r) for r in _penalised_rows(pa, out)])
    p = S._params(PEN, [], "processed_logprobs")
    note = {"repetition_penalty": S.REPETITION_NOT_ADDITIVE.split(";")[0]}
    v = S.judge("penalties", PEN, p, _sent(out), control, MK, "processed_logprobs", None,
                rows=(pa, rows_case), rows_note=note)
    assert v.status == "holds" and _rows_judged(v, "processed_logprobs") == (9, 3)
    assert "not additive in log-probabilities" in v.not_judged["repetition_penalty"]
    # presence not applied at index 2 (5 emitted twice): only frequency's 0.6 raises column 5
    bad = [_logprobs(r) for r in _penalised_rows(pa, out)]
    bad[2][5] -= 0.5
    v = S.judge("penalties", PEN, p, _sent(out), control, MK, "processed_logprobs", None,
                rows=(pa, _sent(out, bad)), rows_note=note)
    assert v.status == "violated" and v.first["out_index"] == 2 and v.first["column"] == 5
    # the repetition penalty alone: nothing additive to judge, said why
    v = _judge("penalties", {"repetition_penalty": 1.5}, _sent(out), control)
    assert v.status == "not judged" and "not additive in log-probabilities" in v.message


def test_aligned_control_one_token_requests_past_the_divergence():
    """The control's rows where its greedy output leaves the case's: one-token requests on the
    prompt + the case's prefix, at the columns the case returned."""
    def complete(body):
        n = len(body["prompt"]) - len(PROMPT)  # the case's prefix length in the prompt
        ids = body.get("logprob_token_ids") or [5, 6]
        toks = [5] if body["max_tokens"] == 1 else [5, 6, 6]
        tops = [{f"token_id:{t}": -1.0 - n - 0.01 * t for t in ids} for _ in toks]
        return {"choices": [{"token_ids": toks, "text": "", "finish_reason": "length",
                             "logprobs": {"top_logprobs": tops}}]}

    ep = _Endpoint("unused", complete=complete)
    case = _sent([5, 5, 9], [{5: -1.0, 6: -2.0}, {5: -1.0, 9: -3.0}, {9: -1.0}])
    ctl = S.aligned_control(ep, "m", case, 20, 3)
    assert ctl.output == [5, 5, 9] and len(ctl.tops) == 3
    sent = [b for path, b in ep.bodies if path == "/v1/completions"]
    # the full control ([5, 6, 6]) shares the prefix of indices 0 and 1; index 2 is its own
    assert len(sent) == 2 and "logprob_token_ids" not in sent[0]
    assert sent[1]["prompt"] == PROMPT + [5, 5] and sent[1]["max_tokens"] == 1
    assert sent[1]["logprob_token_ids"] == [9]
    assert set(ctl.tops[2]) == {9} and ctl.tops[2][9] == pytest.approx(-3.09)


def test_grammar_mask_on_processed_rows(tiny):
    """A column the grammar disallows must come back masked (the clamp); the control (no
    grammar) cannot show it, the grammar's own mask does. At output index 0 only '{' (90)."""
    root, tok = tiny
    out = tok.encode('{"a"', add_special_tokens=False)
    ep = _Endpoint(root, lambda s: tok.encode(s, add_special_tokens=False))
    p = S._params(SCHEMA_KW, [], "processed_logprobs")
    raw = [{90: -8.3, 1: -8.31, 5: -8.32} for _ in out]
    control = S.Sent({}, NO_THINK, out, "length", None, raw, None, None)

    def verdict(row0):
        case = S.Sent({}, NO_THINK, out, "length", '{"a"', [row0] + [{} for _ in out[1:]],
                      None, None)
        g, why, allowed = S.grammar_evidence(ep, "m", p, case, THINK)
        return S.judge("structured_output", SCHEMA_KW, p, case, control, THINK,
                       "processed_logprobs", None, grammar=g, no_grammar=why, allowed=allowed)

    v = verdict({90: -0.0001, 1: -9999.0, 5: -9999.0})
    assert v.status == "holds" and _rows_judged(v, "processed_logprobs") == (3, 1), v
    v = verdict({90: -0.7, 1: -9999.0, 5: -0.7})
    assert v.status == "violated" and v.first["contract"] == "structured_output"
    assert v.first["out_index"] == 0 and v.first["column"] == 5 and "-inf" in v.first["what"]


def test_processed_logprobs_blames_the_broken_column_not_the_reference():
    """A penalty landing on a column no contract names (one column past the input token): the
    log-softmax shift is the median over the unchanged columns, so that column is the breach."""
    raw = {5: 2.0, 6: -1.0, 9: 0.5, 12: 0.1, 13: -0.2}
    out = [5, 5]
    add = {"presence_penalty": -0.5, "frequency_penalty": -0.3}
    p = S._params(add, [], "processed_logprobs")
    rows = _penalised_rows(p, out, raw)
    rows[1][6] += 0.5  # column 6: unchanged by the contract, raised by the fault
    case = _sent(out, [_logprobs(r) for r in rows])
    v = _judge("penalties", add, case, _sent(out, [_logprobs(raw) for _ in out]))
    assert v.status == "violated" and v.first["out_index"] == 1 and v.first["column"] == 6
    assert "(unchanged) and the row's log-softmax shift" in v.first["what"]
