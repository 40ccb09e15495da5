import json, sys, math
from workbook.core.contracts import close
ver = sys.argv[1]
ref = json.load(open(f"/tmp/plp/{ver}-none.json"))
for m in sys.argv[2:]:
    try: r = json.load(open(f"/tmp/plp/{ver}-{m}.json"))
    except FileNotFoundError: print(m, "missing"); continue
    print("==", m, r["version"])
    for k in sorted(ref):
        if not k.startswith("pl_") and not k.startswith("stop_sst") and k != "nat_base": continue
        a, b = ref[k], r.get(k)
        if k.endswith("error") or (isinstance(b, str)):
            print(k, "ref", a, "spec", b); continue
        if k.startswith("stop_sst"):
            print(k, "none:", a["out"]["ids"], repr(a["out"]["text"]), a["out"]["finish"], "| spec:", b["out"]["ids"], repr(b["out"]["text"]), b["out"]["finish"], "logprobs n", len(b["out"]["logprobs"] or []))
            continue
        if k == "nat_base":
            print(k, "ids same", a["ids"] == b["ids"]); continue
        for i, (x, y) in enumerate(zip(a, b)):
            msgs = []
            if x["ids"] != y["ids"]: msgs.append(f"ids differ {x['ids']} vs {y['ids']}")
            for name in ("prompt_logprobs", "logprobs"):
                px, py = x[name], y[name]
                if px is None and py is None: continue
                if (px is None) != (py is None) or len(px) != len(py):
                    msgs.append(f"{name} len {None if px is None else len(px)} vs {None if py is None else len(py)}"); continue
                bad = []
                for j, (dx, dy) in enumerate(zip(px, py)):
                    if dx is None and dy is None: continue
                    if (dx is None) != (dy is None): bad.append((j, "none")); continue
                    common = set(dx) & set(dy)
                    diffs = [(t, dx[t], dy[t]) for t in common if not close(dx[t], dy[t])]
                    if diffs: bad.append((j, diffs[:2], "max|d|", max(abs(dx[t]-dy[t]) for t in common)))
                if bad: msgs.append(f"{name}: {len(bad)} positions differ, first {bad[:3]}")
            print(k, i, "OK" if not msgs else msgs)
