"""The report's first screen: the user's question answered first, never contradicting itself.

The question is #54906's: does vLLM honour ``thinking_token_budget`` (under MRV2, with
speculative decoding)? ``answer_html(f, runs, grids, groups)`` heads the finding box: the batch's own
headline (``workbook.report.finding``'s counts) with the reasoning end its runs were judged
with, then what the constraints grids showed for the same constraint, per configuration.
``constraints_html(grids, groups, source)`` is the grids' box: per constraint, what held and
what did not; each violated group named by configuration (the non-default axis values its
cells share), methods, versions, and the finding of ``outputs/findings/findings.yaml`` that
covers it with that finding's triage (``workbook.report.findings.triage_of``: intended, known
with links, new — or "not triaged"). A group whose cells include method ``none`` is said to
happen "with and without speculative decoding"; only a group ``none`` held at the same grid
points is said to happen "only under speculative decoding". Committed grids say that they are
committed evidence and of which versions.

``violated_groups(grids, findings)`` is the grouping: a violated cell belongs to a finding when
the finding's constraint is the cell's constraint or the contract its verdict names, every
axis value the finding names is the cell's, and the finding's reproducer did not hold on the
cell's vLLM version; the rest is grouped by constraint. Counted from the
cells themselves. Not here: judging (``workbook.run.constraints``), the findings registry
(``workbook.report.findings``), the grid tables (``workbook.report.constraints``).
"""

from __future__ import annotations

import html
from collections import Counter
from dataclasses import dataclass, field

from workbook.report import findings as findings_mod
from workbook.report.constraints import committed, verdict_of

QUESTION = "thinking_token_budget"
DEFAULT_END = "the reasoning parser's own end (no reasoning_end_str configured)"


@dataclass
class Group:
    """Violated cells of one constraint that one finding covers (``finding`` None: none does)."""

    constraint: str
    finding: dict | None
    cells: list[tuple[dict, dict]] = field(default_factory=list)  # (grid, cell)

    @property
    def methods(self) -> list[str]:
        from workbook.run.constraints.cases import METHODS

        got = {c["method"] for _, c in self.cells}
        return [m for m in METHODS if m in got] + sorted(got - set(METHODS))

    @property
    def versions(self) -> list[str]:
        return _sorted_versions({str(g.get("vllm_version")) for g, _ in self.cells})


def _sorted_versions(vs) -> list[str]:
    def key(v):
        return tuple(int(x) if x.isdigit() else -1 for x in str(v).split("."))
    return sorted(vs, key=key)


def non_default(grid: dict, cell: dict) -> dict[str, str]:
    """The cell's axis values that are not the grid's defaults (its configuration)."""
    defaults = grid.get("axis_defaults") or {}
    return {k: str(v) for k, v in (cell.get("axes") or {}).items()
            if k in defaults and str(v) != str(defaults[k])}


def _covers(f: dict, cell: dict, version=None) -> bool:
    contract = (verdict_of(cell) or {}).get("contract")
    if f.get("constraint") not in (cell["constraint"], contract):
        return False
    if (f.get("versions") or {}).get(str(version)) == "held":
        return False  # the finding's reproducer held on the cell's version: not this one
    axes = {k: str(v) for k, v in (cell.get("axes") or {}).items()}
    return all(axes.get(k) == str(v) for k, v in (f.get("axes") or {}).items())


def violated_groups(grids: list[dict], findings: list[dict]) -> list[Group]:
    """Every violated cell of ``grids`` in one group: (constraint, the finding covering it)."""
    out: dict[tuple, Group] = {}
    for g in grids:
        for c in g.get("cells", []):
            if c["status"] != "violated":
                continue
            f = next((f for f in findings if _covers(f, c, g.get("vllm_version"))), None)
            key = (c["constraint"], f["id"] if f else None)
            out.setdefault(key, Group(c["constraint"], f)).cells.append((g, c))
    return list(out.values())


def configuration_text(group: Group) -> str:
    """Where the group's cells were: the non-default axis values they all share, else how many
    configurations (the default among them or not)."""
    confs = [non_default(g, c) for g, c in group.cells]
    common = {k: v for k, v in confs[0].items() if all(x.get(k) == v for x in confs)}
    if common:
        return ", ".join(f"{k}={v}" for k, v in sorted(common.items()))
    labels = {tuple(sorted(x.items())) for x in confs}
    if labels == {()}:
        return "the default configuration"
    shown = sorted(", ".join(f"{k}={v}" for k, v in lab) or "default" for lab in labels)
    more = f" and {len(shown) - 4} more" if len(shown) > 4 else ""
    return f"{len(labels)} configurations ({'; '.join(shown[:4])}{more})"


def _none_point(grid: dict, cell: dict) -> tuple:
    """Where method none's cell for ``cell`` sits: the same batch and axis values, an axis none
    never runs (a speculative-only one: drafter steering) at its default."""
    took: dict[str, set] = {}
    for c in grid.get("cells", []):
        if c["method"] == "none":
            for k, v in (c.get("axes") or {}).items():
                took.setdefault(k, set()).add(str(v))
    defaults = grid.get("axis_defaults") or {}
    axes = {k: (str(v) if str(v) in took.get(k, ()) else str(defaults.get(k, v)))
            for k, v in (cell.get("axes") or {}).items()}
    return cell["batch"], tuple(sorted(axes.items()))


def speculation(group: Group) -> tuple[str, str]:
    """(with and without speculative decoding | only under / under speculative decoding |
    (only) without speculative decoding, the evidence for it): "with and without" when method
    none's cells and a speculative method's are among the group's; "only under" when none held
    at every one of the group's points (else what none's cells there were); for none alone,
    what the speculative methods' cells at the same points were."""
    if "none" in group.methods and len(group.methods) > 1:
        return "with and without speculative decoding", ""
    if group.methods == ["none"]:  # what the speculative methods did at the same points
        got = Counter()
        for g, cell in group.cells:
            key = (cell["batch"], tuple(sorted((cell.get("axes") or {}).items())))
            got.update(c["status"] for c in g.get("cells", []) if c["method"] != "none"
                       and c["constraint"] == group.constraint
                       and (c["batch"], tuple(sorted((c.get("axes") or {}).items()))) == key)
        said = ", ".join(f"{k} {v}" for v, k in sorted(got.items())) or "not run"
        head = ("only without speculative decoding" if got and set(got) == {"holds"}
                else "without speculative decoding")
        return head, f"the speculative methods at the same points: {said}"
    seen = []
    for g, cell in group.cells:
        want = _none_point(g, cell)
        ref = [c["status"] for c in g.get("cells", []) if c["method"] == "none"
               and c["constraint"] == group.constraint
               and (c["batch"], tuple(sorted((k, str(v)) for k, v in
                                             (c.get("axes") or {}).items()))) == want]
        seen.append(ref[0] if ref else "not run")
    if seen and all(s == "holds" for s in seen):
        return "only under speculative decoding", "method none held at the same points"
    n = Counter(seen)
    return "under speculative decoding", ("method none at the same points: " + ", ".join(
        f"{k} {v}" for v, k in sorted(n.items())))


def versions_text(versions: list[str], grids: list[dict]) -> str:
    every = _sorted_versions({str(g.get("vllm_version")) for g in grids})
    if len(versions) > 2 and versions == [v for v in every if v in versions] and \
            every.index(versions[-1]) - every.index(versions[0]) == len(versions) - 1:
        return f"vLLM {versions[0]}–{versions[-1]}"
    return "vLLM " + ", ".join(versions)


def _link(url: str, text: str) -> str:
    return f'<a href="{html.escape(url)}">{html.escape(text)}</a>'


def triage_html(f: dict | None) -> str:
    """The finding's id and triage as HTML (links when the record gives them)."""
    if f is None:
        return ('<span class="note">no finding in outputs/findings/findings.yaml covers it: '
                "not triaged</span>")
    t = findings_mod.triage_of(f)
    links = ", ".join(_link(u, text) for text, u in t["links"])
    said = {"known": "known upstream" + (f": {links}" if links else ""),
            "intended": "triaged as intended by vLLM (not a defect)"
                        + (f": {links}" if links else ""),
            "new": "new: not found upstream" + (f" (related: {links})" if links else "")}
    text = said.get(t["kind"]) or ("not triaged" + (f" (the registry's upstream note links "
                                                     f"{links})" if links else ""))
    return f'finding <a href="#findings"><b>{html.escape(f["id"])}</b></a> — {text}'


def group_html(group: Group, grids: list[dict]) -> str:
    n = len(group.cells)
    head, note = speculation(group)
    return (f"<li>✗ <b>{html.escape(configuration_text(group))}</b>: {html.escape(head)} "
            f"({html.escape(', '.join(group.methods))}{'; ' + html.escape(note) if note else ''})"
            f"; {html.escape(versions_text(group.versions, grids))}; {n} cell"
            f"{'' if n == 1 else 's'} → {triage_html(group.finding)}</li>")


def _counts(grids: list[dict]) -> dict[str, Counter]:
    by: dict[str, Counter] = {}
    for g in grids:
        for c in g.get("cells", []):
            by.setdefault(c["constraint"], Counter())[c["status"]] += 1
    return by


def constraint_rows(grids: list[dict], groups: list[Group]) -> list[tuple[str, Counter, list]]:
    """(constraint, its cells' statuses, its violated groups), in the grids' constraint order."""
    order: list[str] = []
    for g in grids:
        order += [k for k in g.get("constraints", []) if k not in order]
    counts = _counts(grids)
    order += [k for k in counts if k not in order]
    return [(k, counts.get(k, Counter()), [x for x in groups if x.constraint == k])
            for k in order if k in counts]


def grids_label(grids: list[dict]) -> str:
    """"committed evidence (15 grids of vLLM 0.28.0–0.32.0, not this run's)" and / or "2 grids
    of your own (vLLM 0.32.0)": which grids, of which versions, where from."""
    parts = []
    for mine, (what, tail) in ((False, ("committed evidence", ", not this run's")),
                               (True, ("grids of your own", ""))):
        gs = [g for g in grids if committed(g) != mine]
        if not gs:
            continue
        vs = versions_text(_sorted_versions({str(g.get("vllm_version")) for g in gs}), gs)
        n = len(gs)
        parts.append(f"{what} ({n} grid{'' if n == 1 else 's'} of {vs}{tail})" if not mine
                     else f"{n} grid{'' if n == 1 else 's'} of your own ({vs})")
    return " and ".join(parts)


def headline(grids: list[dict], groups: list[Group]) -> str:
    rows = constraint_rows(grids, groups)
    what = grids_label(grids)
    if not groups:
        n = sum(c["holds"] for _, c, _ in rows)
        return (f"Every judged constraint held in the constraints grids, {what}: {n} cells "
                "held at every row and on the output.")
    bad = [(k, gs) for k, _, gs in rows if gs]
    held = [k for k, c, gs in rows if not gs and c["holds"]]
    said = ", ".join(f"{k} ({len(gs)} configuration{'' if len(gs) == 1 else 's'})"
                     for k, gs in bad)
    return (f"The constraints grids, {what}: {len(bad)} of {len(rows)} constraints violated "
            f"in some configuration — {said}; {len(held)} held wherever judged.")


def constraints_html(grids: list[dict], groups: list[Group], source: str | None = None) -> str:
    """The grids' box: the headline, then one row per constraint (held, violated, where)."""
    if not grids:
        return ""
    e = html.escape
    body = []
    for k, c, gs in constraint_rows(grids, groups):
        other = sum(n for st, n in c.items() if st not in ("holds", "violated"))
        where = ("<ul>" + "".join(group_html(x, grids) for x in gs) + "</ul>") if gs else \
            ("held wherever judged" if c["holds"] else "nothing judged")
        body.append(f"<tr><th>{e(k)}</th><td>{c['holds']}</td>"
                    f"<td class=\"{'v-violated' if c['violated'] else ''}\">{c['violated']}</td>"
                    f"<td>{other}</td><td>{where}</td></tr>")
    alarm = " alarm" if groups else ""
    return (f'<section class="finding{alarm} cbox"><p class="headline">'
            f"{e(headline(grids, groups))} (<a href=\"#constraints\">grid</a>)</p>"
            '<div class="tw"><table class="plain"><thead><tr><th>constraint</th><th>cells held'
            "</th><th>violated</th><th>refused / not judged / not run</th><th>where violated "
            "(configuration: methods; versions; cells → finding and triage)</th></tr></thead>"
            f"<tbody>{''.join(body)}</tbody></table></div>"
            + (f'<p class="note">{e(source)}</p>' if source else "") + "</section>")


def scope_sentence(runs) -> str:
    """Which reasoning end the batch's finished runs without a fault were judged with ("" when
    none finished)."""
    healthy = [r for r in runs if r.category == "healthy" and r.finished_ok]
    if not healthy:
        return ""
    ends = {r.config.get("reasoning_end_str") for r in healthy}
    said = DEFAULT_END if ends == {None} else "reasoning_end_str " + ", ".join(
        sorted("the parser's own" if x is None else repr(x) for x in ends))
    return f"Its runs without a fault were judged with {said}."


def grid_lines(grids: list[dict], groups: list[Group]) -> list[str]:
    """What the grids' cells of the same constraint showed: how many held (the default
    configuration's all, when so), and each violated configuration with its finding."""
    mine = [c for g in grids for c in g.get("cells", []) if c["constraint"] == QUESTION]
    if not mine:
        return []
    bad = [x for x in groups if x.constraint == QUESTION]
    held = sum(c["status"] == "holds" for c in mine)
    what = f"The constraints grids, {grids_label(grids)}"
    if not bad:
        return [f"{what}: {QUESTION} held in {held} of {len(mine)} cells, every judged one."]
    n_bad = sum(len(x.cells) for x in bad)
    confs = "; ".join(f"{configuration_text(x)} {speculation(x)[0]}"
                      f" ({'finding ' + x.finding['id'] if x.finding else 'no finding recorded'})"
                      for x in bad)
    default_ok = all(non_default(g, c) for x in bad for g, c in x.cells)
    return [f"{what}: {QUESTION} held in {held} of {len(mine)} cells"
            + (", and none of the default configuration violated" if default_ok else "")
            + f"; violated in {n_bad} cell{'' if n_bad == 1 else 's'}, in "
            f"{len(bad)} configuration{'' if len(bad) == 1 else 's'}: {confs}."]


def answer_html(f: dict, runs, grids: list[dict], groups: list[Group]) -> tuple[str, str]:
    """(the box's class, its head): the question, the batch's headline with the reasoning end
    its runs were judged with, then what the grids showed for the same constraint. The box is
    not green when the grids show the constraint violated somewhere (class ``mixed``)."""
    lines = grid_lines(grids, groups)
    klass = " alarm" if f["alarm"] else " warn" if f["warn"] else \
        " mixed" if any(x.constraint == QUESTION for x in groups) else ""
    parts = list(f.get("parts") or [f["headline"]])
    scope = scope_sentence(runs)
    if scope and f.get("healthy_said"):  # right after what healthy vLLM did
        parts.insert(1, scope)
    head = " ".join(parts)
    rest = "".join(f"<li>{html.escape(x)}</li>" for x in lines)
    return klass, (f'<p class="q">Does vLLM honour {QUESTION}?</p>'
                   f'<p class="headline">{html.escape(head)}</p>'
                   + (f'<ul class="answer">{rest}</ul>' if rest else ""))
