"""One self-contained HTML report over run folders of ``workbook run`` (any hardware).

``write(run_dirs, path)`` builds, from the files each run folder holds (``manifest.json``,
``environment.json`` and each run's evidence via ``workbook.core.rundir.load_run``), a page that
leads with the finding and then shows the evidence:

1. **Finding** — one sentence over everything, then per hardware and batch: verdict counts
   (runs without a fault, runs with an injected fault, runs with the guard), each violated run
   as stage → cause → first step / row (and the diagnosis' ``chain`` / ``causes`` when it gives
   them), and whether the guard fixed it; per run with the guard on, what the guard did
   (tokens fixed, fields of its own state repaired — or that it changed nothing);
   interrupted or unfinished batches say so here.
2. **Verdicts** — a run × batch matrix and one table over every run (no paging; every request
   of a run judged); links to each run's executed notebook rendered as HTML.
3. **Violations** — (and **What the guard did**: every repair each guarded run logged) per
   violated run: the steps × rows picture of the violating request
   (``workbook.report.grid``: decoded tokens, forced / accepted / emitted, the budget's cell),
   the end-token logit before and after the bias at that step, and the first divergence from
   the nearest honoured run (its guarded twin when there is one).
4. **Where </think> came** (every request of every run), failures, time per run, run folders,
   the effective configuration (what differs between runs, what is common), collect-env.
5. **Constraints under speculative decoding** — the constraint × method grid of each
   ``grid.json`` found (``workbook.report.constraints``); no section when there is none. With
   a grid, the lead also lists the **findings on released vLLM** (``workbook.report.findings``:
   the registry committed under ``outputs/findings/``), each ✗ of the axes picture linked to
   its reproducer.

The runs and what each did are ``workbook.report.runs``'s, the finding's counts and sentences
``workbook.report.finding``'s, the page machinery (tables, itables offline, CSS)
``workbook.report.page``'s, the tables over runs ``workbook.report.tables``' and the pictures
``workbook.report.plots``'; this module lays out the sections; absent values are worded by ``workbook.report.wording`` (one
wording per fact; an empty table is a sentence). Images are ``data:`` URIs. The page loads
nothing from the network. Not here: running anything, judging a run (the verdicts are
``workbook.run.budget.diagnose``'s, read from ``verdict.json``).
"""

from __future__ import annotations

import datetime as dt
import html
import os

import pandas as pd

from workbook.report import constraints as constraints_section
from workbook.report import findings as findings_section
from workbook.report import grid, wording
from workbook.report.finding import (cause_text, chain_text, count_line, finding,  # noqa: F401
                                     guard_runs, n_requests, named_by, repairs, stage_of,
                                     stage_text, terminal_lines, where_text)
from workbook.report.page import CSS, Page, link_html, offline_init  # noqa: F401
from workbook.report.runs import (SPEC_KEYS, Batch, NoRuns, Run, first_violated,  # noqa: F401
                                  n_diff, verdict_records,
                                  same_batch, verdict_name, judged_requests, load_batch,
                                  nearest_honoured, verdict_of)
from workbook.report.plots import plot_end_index, plot_timings, png  # noqa: F401
from workbook.report.tables import (CONTEXT_AFTER, batches_table, divergence,  # noqa: F401
                                    effective_tables, emitted_steps, failures_table,
                                    focus_request, pairs, time_parts, timings_table,
                                    verdict_matrix, verdict_table)
from workbook.report.wording import DASH, NOT_RECORDED  # noqa: F401  (DASH: the tables' "not applicable")

MAX_VIOLATIONS = 12


def _finding_html(f: dict) -> str:
    klass = " alarm" if f["alarm"] else " warn" if f["warn"] else ""
    out = [f'<section class="finding{klass}">',
           f'<p class="headline">{html.escape(f["headline"])}</p>']
    for pb in f["batches"]:
        b: Batch = pb["batch"]
        cats = pb["cats"]
        state = "" if b.finished and b.manifest.get("status") != "interrupted" else (
            f' <span class="tag bad">{html.escape(str(b.manifest.get("status") or "unfinished"))}'
            "</span>")
        out.append(f"<div class=\"fb\"><h3>{html.escape(b.hardware)} — vLLM {html.escape(b.vllm)}"
                   f" on {html.escape(b.device)}, batch {html.escape(b.run_id)}{state}</h3><ul>")
        labels = {"healthy": "without a fault", "fault": "with an injected fault, guard off",
                  "guard": "with the guard on"}
        for k in ("healthy", "fault", "guard"):
            if cats[k]:
                ok, n = n_requests(cats[k])
                out.append(f"<li><b>{len(cats[k])} run{'' if len(cats[k]) == 1 else 's'} "
                           f"{labels[k]}</b>: "
                           f"{html.escape(count_line(cats[k]))} "
                           f"<span class=\"note\">({ok} of {n} requests judged honoured the "
                           "budget)</span></li>")
        out.append("</ul>")
        if pb.get("state"):
            out.append(f'<p class="bad">{html.escape(pb["state"])}</p>')
        if pb["violated"]:
            out.append('<ol class="viol">')
            for v in pb["violated"]:
                r: Run = v["run"]
                fault = (f"fault {v['fault']} injected" if v["fault"] != "none"
                         else '<b class="bad">no fault injected</b>')
                chain = (f'<br><span class="chain">{html.escape(v["chain"])}</span>'
                         if v["chain"] else "")
                anchor = f"v-{_slug(r.label)}"
                out.append(
                    f'<li><a href="#{anchor}"><b>{html.escape(r.name)}</b></a> ({fault}): '
                    f'<span class="stage">{html.escape(v["stage"] or "stage not named")}</span> → '
                    f'<span class="cause">{html.escape(v["cause"])}</span> → '
                    f'{html.escape(v["where"])}. '
                    f'<span class="{"ok" if v["fixed"] else "note"}">{html.escape(v["guard"])}'
                    f"</span>{chain}</li>")
            out.append("</ol>")
        if pb.get("guard"):
            out.append('<ul class="guard">')
            for r, said in pb["guard"]:
                out.append(f"<li><b>{html.escape(r.name)}</b> (guard on): {html.escape(said)}"
                           "</li>")
            out.append("</ul>")
        for r in pb["not_ok"]:
            fl = r.row.get("failure") or {}
            out.append(f'<p class="bad">{html.escape(r.name)}: {html.escape(str(r.row.get("status")))}'
                       f" — {html.escape(str(fl.get('ename') or ''))}: "
                       f"{html.escape(str(fl.get('evalue') or '')[:200])}</p>")
        out.append("</div>")
    out.append("</section>")
    return "".join(out)


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text)


# effective-configuration keys whose None is a reading, not a gap: the engine was built without
# speculative decoding (``workbook.vllm.effective`` sets them from vLLM's speculative_config)


# ---------------------------------------------------------------- divergence


# ---------------------------------------------------------------- HTML

def _violations(page: Page, runs: list[Run]) -> None:
    page.h(2, "Violations: the step × row picture", "violations")
    bad = [r for r in runs if verdict_name(r) == "violated"]
    if not bad:
        page.p("No run violated the budget: nothing to show here.", "empty")
        return
    page.p("For each violated run, the first violated request: one column per engine step, "
           "one row per logits row (row 0 the target, row j the j-th draft); the tokens are "
           "decoded. Hover a cell for its details; the table under it is the violating step, "
           "with the </think> logit before and after the budget's bias.", "note")
    for r in bad[:MAX_VIOLATIONS]:
        v = r.verdict
        reqs = judged_requests(r)
        focus = focus_request(r)
        req = reqs[focus] if reqs else {}
        page.raw('<div class="viol-block">')
        page.h(3, f"{r.short} — {stage_text(r) or 'stage not named'} → {cause_text(named_by(r))}",
               f"v-{_slug(r.label)}")
        chain = chain_text(v)
        text = where_text(r) + "." + (f" Chain: {chain}." if chain else "") + \
            (f" Diagnosis: {v.get('reason')}." if v.get("reason") else "")
        page.p(text)
        n_bad = sum(q["honored"] is False for q in reqs)
        if n_bad > 1:
            said = ", ".join(f"{wording.budget_text(q['budget'])}"
                             + (f": {q['kind']}" if q.get("kind") else "")
                             for q in reqs if q["honored"] is False)
            page.p(f"{n_bad} of {len(reqs)} requests of this run violated the budget "
                   f"(budgets {said}); the first is drawn.", "note")
        if r.notebook_link:
            page.raw(f'<p class="note">Executed notebook: {link_html(r.notebook_link, "open")}</p>')
        g = grid.cells(r.frames, req.get("req_id")) if r.frames and req else pd.DataFrame()
        if g.empty:
            page.p("(no trace for this run: the tokens as the client saw them)", "empty")
        else:
            gr = {"expected_end_index": req.get("expected"), "honored": req.get("honored")}
            steps = sorted(int(s) for s in g["step"].unique())
            rec = first_violated(r) or {}
            focus_step = rec.get("step") if rec.get("request") == req.get("req_id") else \
                grid.violation_step(g, gr)
            win = grid.window_around(steps, focus_step, 14)
            if len(win) < len(steps):
                page.p(f"Steps {win[0]}–{win[-1]} of {len(steps)} shown (steps {steps[0]}–"
                       f"{steps[-1]} traced; the window starts a few steps before the "
                       "violating one); the executed notebook's step explorer shows every "
                       "step.", "note")
            page.raw(grid.grid_html(g, gr, r.decode, r.end_ids, steps=win))
            if focus_step is not None:
                page.plain(grid.rows_at_step(g, int(focus_step), r.decode),
                           f"step {focus_step}: every logits row of the request",
                           empty=f"The trace holds no logits row of this request at step "
                                 f"{focus_step}.")
        other = nearest_honoured(r, runs)
        if other is not None:
            first, table, index = divergence(r, other)
            page.p(f"Against {other.short} (request {index + 1}): "
                   + ("identical emitted tokens" if first is None
                      else f"first divergence at output #{first}"), "note")
            page.plain(table, f"A = {r.short}, B = {other.short}",
                       empty="Neither run emitted a token for this request.")
        page.raw("</div>")
    if len(bad) > MAX_VIOLATIONS:
        page.p(f"… and {len(bad) - MAX_VIOLATIONS} more violated runs (see the verdict "
               "table).", "note")


def _guard(page: Page, runs: list[Run]) -> None:
    """Per run with the guard on: what it did, and every repair of its own state it logged."""
    found = guard_runs(runs)
    if not found:
        return
    page.h(2, "What the guard did", "guard")
    page.p("Per run with the guard on: tokens it replaced (a due </think> that vLLM did not "
           "commit) and fields of its own device state it found differing from the host's "
           "truth and repaired; every repair is listed (the trace's guard table).", "note")
    for r, said in found:
        page.h(3, r.short)
        page.p(said[0].upper() + said[1:] + ".")
        recs = repairs(r)
        if recs:
            page.plain(pd.DataFrame(recs).map(
                lambda x: wording.value_text(x) if not isinstance(x, str) else x),
                f"every repair the guard logged in {r.name}")


def _divergences(page: Page, runs: list[Run]) -> None:
    """First divergence between runs when nothing was violated (MTP vs no speculation)."""
    if any(verdict_name(r) == "violated" for r in runs):
        return
    found = pairs(runs)
    page.h(2, "First divergence between runs", "divergence")
    if not found:
        page.p("(fewer than two finished runs)", "empty")
    for a, b in found:
        first, table, index = divergence(a, b)
        page.h(3, f"A = {a.short}  vs  B = {b.short} (request {index + 1})")
        page.p("identical emitted tokens" if first is None
               else f"first divergence at output #{first}", "note")
        page.plain(table, "emitted tokens step by step (path, forced from the trace)",
                   empty="Neither run emitted a token for this request.")


def build(batches: list[Batch], base: str | None = None, grids: list[dict] | None = None,
          grid_source: str | None = None) -> str:
    """The page over ``batches``; ``base``: the report's folder (for relative links);
    ``grids``: constraints grids (``constraints_section.load``) — a section when any;
    ``grid_source``: a sentence saying where they come from when not from these runs."""
    runs = [r for b in batches for r in b.runs]
    found, registry_error = [], None
    if grids:
        try:
            found = findings_section.load()
        except findings_section.BadRegistry as e:  # the report still shows the grids
            registry_error = f"The findings registry could not be read: {e}."
    findings_section.attach(grids or [], found, base)
    if not runs and grids:  # a constraints grid's run folder (workbook.run.constraints.grid): its grid
        page = Page(constraints_section.TITLE)
        page.h(1, page.title)
        page.p(f"Generated {dt.datetime.now().astimezone().isoformat(timespec='seconds')} from "
               f"{len(grids)} constraints grid(s).", "note")
        page.raw(constraints_section.finding_html(grids))
        page.raw(findings_section.section_html(  # intended ones: said not to be defects
            [f for f in found if f["triage"] == "intended" or set(findings_section.violated_in(f))
             & {str(g.get("vllm_version")) for g in grids}], base))
        page.raw(constraints_section.section_html(grids))
        return page.render()
    if not runs:
        raise NoRuns("no runs in " + ", ".join(b.folder for b in batches))
    for r in runs:
        r.notebook_link = _notebook_link(r, base)
    page = Page("vLLM #54906 — thinking_token_budget investigation report")
    page.h(1, page.title)
    page.p(f"Generated {dt.datetime.now().astimezone().isoformat(timespec='seconds')} from "
           f"{len(batches)} batch folder(s), {len(runs)} run(s).", "note")
    page.raw(_finding_html(finding(batches)))
    if grids:
        page.raw(constraints_section.finding_html(grids))
        if grid_source:
            page.p(grid_source, "note")
        page.raw(findings_section.section_html(found, base))
        if registry_error:
            page.p(registry_error, "note")
    page.raw('<nav class="toc"><a href="#verdicts">Verdicts</a><a href="#violations">'
             'Violations</a><a href="#where">Where &lt;/think&gt; came</a><a href="#failures">'
             'Failures</a><a href="#time">Time</a><a href="#folders">Run folders</a>'
             '<a href="#effective">Effective configuration</a>'
             + ('<a href="#findings">Findings</a>' if found else "")
             + ('<a href="#constraints">Constraints</a>' if grids else "") + '</nav>')
    page.h(2, "Verdicts", "verdicts")
    vt = verdict_table(runs)
    page.plain(verdict_matrix(vt), "verdict per run name and batch (a run that did not "
                                   "finish shows its status)",
               empty="No run recorded a verdict.")
    page.table(vt, "every run: verdict, cause, requests honoured, configuration, outcome as "
                   "the server reports it")
    _violations(page, runs)
    _guard(page, runs)
    _divergences(page, runs)
    page.h(2, "Where </think> came", "where")
    page.image(plot_end_index(runs), "where </think> came, every request")
    page.h(2, "Failures", "failures")
    ft = failures_table(runs)
    if ft.empty:
        page.p("Every run finished.", "empty")
    else:
        page.plain(ft, "runs that did not finish (interrupted: stopped by a signal)")
    page.h(2, "Time per run", "time")
    page.image(plot_timings(runs), "timings")
    page.plain(timings_table(runs), "seconds per part (every part of a run's wall time)",
               empty="No run recorded its timings.")
    page.h(2, "Run folders", "folders")
    page.plain(batches_table(batches), empty="No batch folder.")
    page.h(2, "Effective configuration", "effective")
    for b in batches:
        differ, common = effective_tables(b.runs)
        page.h(3, f"{b.hardware} {b.run_id}: read from the live engine")
        if differ.empty and common.empty:
            page.p("No run of this batch recorded its effective configuration "
                   "(effective.json): none reached a live engine.", "empty")
            continue
        page.plain(differ, "what differs between the runs",
                   empty="Every run of this batch ran the same effective configuration.")
        page.plain(common, "the same in every run",
                   empty="No setting is the same in every run.")
    if grids:
        page.raw(constraints_section.section_html(grids))
        if grid_source:
            page.p(grid_source, "note")
    for b in batches:
        ce = (b.environment.get("collect_env") or {}).get("output")
        if ce:
            page.pre(ce, f"vllm collect-env — {b.hardware} {b.run_id}")
    return page.render()


def _notebook_link(run: Run, base: str | None) -> str | None:
    """The run's executed notebook as HTML (rendered by the batch, else next to the report)."""
    nb = run.row.get("executed_notebook")
    if not nb:
        return None
    ipynb = os.path.join(run.folder, nb)
    page = os.path.splitext(ipynb)[0] + ".html"
    if not os.path.exists(page) and os.path.exists(ipynb) and base:
        from workbook.batch import nbhtml

        page = os.path.join(base, "notebooks", f"{run.hardware}-{run.run_id}-{run.name}.html")
        if not os.path.exists(page):
            try:
                nbhtml.render(ipynb, page)
            except Exception:
                return None
    if not os.path.exists(page):
        return None
    return os.path.relpath(page, base) if base else page


def default_path(out: str = "outputs") -> str:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S-%f")[:-3]
    return os.path.join(out, "reports", f"report-{stamp}.html")


REPO_OUTPUTS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "outputs")


def committed_grids(root: str = REPO_OUTPUTS) -> tuple[list[str], str | None]:
    """The constraints grids committed with the workbook (``outputs/<hardware>/constraints-*``)
    and the sentence that says so; ([], None) when there are none."""
    found = constraints_section.find(os.path.join(root, "*", "constraints-*"))
    if not found:
        return [], None
    rel = sorted({os.path.relpath(os.path.dirname(os.path.dirname(p)), os.path.dirname(root))
                  for p in found})
    return found, (f"The constraints grids shown are the ones committed with the workbook "
                   f"({len(found)} grid(s) under {', '.join(r + '/constraints-*' for r in rel)}),"
                   " not this run's: `.venv/bin/workbook run constraints` runs a grid of your "
                   "own (docs/constraints.md).")


def write(run_dirs: list[str], path: str, grid_paths: list[str] | None = None,
          committed: bool = False) -> str:
    """Build the report over ``run_dirs`` and write it to ``path``; return the path.
    ``grid_paths``: where to look for constraints ``grid.json`` files (default: the run
    folders themselves) — the "Constraints under speculative decoding" section shows them;
    ``committed``: when those hold none, show the grids committed with the workbook (said so
    on the page: ``workbook run``'s first report).

    Raises ``NoRuns`` when the folders hold no run (nothing is written then)."""
    batches = [load_batch(d) for d in run_dirs]
    base = os.path.dirname(os.path.abspath(path))
    grids = constraints_section.load(list(run_dirs if grid_paths is None else grid_paths))
    source = None
    if not grids and committed:
        paths, source = committed_grids()
        grids = constraints_section.load(paths)
    text = build(batches, base, grids, source if grids else None)
    os.makedirs(base, exist_ok=True)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(path + ".tmp", path)
    return path
