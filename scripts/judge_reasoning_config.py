"""Judge a reasoning_config_probe.py batch (JSON lines) with the one budget rule
(workbook.core.budget.judge): one row per (method, reasoning configuration, budget).
Usage: python scripts/judge_reasoning_config.py BATCH.jsonl > verdicts.md"""
import json
import sys

from workbook.core.budget import Markers, first_index_of, judge


def occurrences(seq, sub):
    n, i, out = len(sub), 0, 0
    while i + n <= len(seq):
        if list(seq[i:i + n]) == list(sub):
            out, i = out + 1, i + n
        else:
            i += 1
    return out


recs, spec, rc, markers, free = [], None, None, None, {}
for line in open(sys.argv[1]):
    line = line.strip()
    if line.startswith("== "):
        spec, rc = line[3:].split(" ", 1)
        markers = None
        continue
    if not line.startswith("{"):
        continue
    d = json.loads(line)
    if "start" in d:
        markers = Markers(d["start"], d["end"], d["natural_end"])
        continue
    if d.get("budget") == -1:
        free[(spec, rc)] = d["token_ids"]
    recs.append((spec, rc, markers, d))

rows = []
for spec, rc, markers, d in recs:
    if "refused" in d:
        rows.append((spec, rc, "-", "refused", d["refused"]))
        continue
    out, b = d["token_ids"], d["budget"]
    if b == -1:
        n = occurrences(out, markers.end)
        rows.append((spec, rc, "none", "no budget", f"end string {n}x in the model's own output; "
                     f"first tokens {out[:6]}"))
        continue
    j = judge(d["prompt_tail"], out, b, markers)
    n = occurrences(out, markers.end)
    e = j.expected_end_index
    seen = out[e:e + len(markers.end)] if e is not None else []
    what = (f"end string due whole at {e}: {list(markers.end)}; output there {seen}; "
            f"end string {n}x in the output")
    own = occurrences(free.get((spec, rc), []), markers.end)
    if j.honored is True and n > 1 and own == 0 and e is not None and \
            out[e:e + 2 * len(markers.end)] == list(markers.end) * 2:
        j = type(j)(j.expected_end_index, j.actual_end_index, False, "twice",
                    e + len(markers.end))
        what += (f"; forced again right after it (the model's own output without a budget "
                 f"holds it 0x): first violating output index {e + len(markers.end)} (twice)")
    elif j.honored is False:
        k = next(i for i, (a, t) in enumerate(zip(seen, markers.end)) if a != t)
        what += f"; first violating output index {e + k} (end[{k}] due, {seen[k]} emitted)"
    rows.append((spec, rc, str(b), j.verdict, what))

print("| method | reasoning_config | budget | verdict (docs' rule) | evidence |")
print("|---|---|---|---|---|")
for r in rows:
    print("| " + " | ".join(str(x).replace("|", "\\|").replace("\n", "\\n") for x in r) + " |")
