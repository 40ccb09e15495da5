"""The HTML report's pictures as ``data:`` URIs (matplotlib, Agg): where ``</think>`` came
relative to where the budget put it (every request of every run), and the time each run spent
per part. Deliberately not here: the numbers themselves (``workbook.report.tables``) or the page
(``workbook.report.html``).
"""

from __future__ import annotations

import base64
import io

from workbook.report.runs import Run, judged_requests
from workbook.report.tables import time_parts


def png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_end_index(runs: list[Run]) -> str | None:
    """Every request of every run: where ``</think>`` came relative to where the budget put it
    (0 = exactly there). One line per run; violated requests in red, "never" at the right."""
    plt = _plt()
    from matplotlib.ticker import MaxNLocator

    data = [(r, judged_requests(r)) for r in runs]
    data = [(r, q) for r, q in data if q]
    if not data:
        return None
    offsets = [(q["actual"] - q["expected"]) for _, qs in data for q in qs
               if q["actual"] is not None and q["expected"] is not None]
    far = max([abs(o) for o in offsets] + [2]) + 2
    fig, ax = plt.subplots(figsize=(10, 0.32 * len(data) + 1.4))
    for y, (r, qs) in enumerate(data):
        groups: dict[tuple, int] = {}
        for q in qs:
            if q["expected"] is None:
                x, kind = None, "none"
            elif q["actual"] is None:
                x, kind = far, "never"
            else:
                x, kind = q["actual"] - q["expected"], "ok" if q["honored"] else "bad"
            if q["honored"] is False and kind == "ok":
                kind = "bad"
            if x is not None:
                groups[(x, kind)] = groups.get((x, kind), 0) + 1
        for (x, kind), n in groups.items():
            color = {"ok": "tab:green", "bad": "tab:red", "never": "tab:red"}[kind]
            ax.scatter([x], [y], s=30 + 12 * min(n, 12), color=color,
                       marker="o" if kind == "ok" else "X", zorder=3)
            if n > 1:
                ax.annotate(f"×{n}", (x, y), xytext=(6, -3), textcoords="offset points",
                            fontsize=7)
        ok = sum(q["honored"] is True for q in qs)
        ax.annotate(f"{ok}/{len(qs)}", (1.0, y), xycoords=("axes fraction", "data"),
                    xytext=(6, -3), textcoords="offset points", fontsize=8,
                    color="tab:green" if ok == len(qs) else "tab:red")
    ax.axvline(0, color="tab:green", alpha=.4)
    ax.set_yticks(range(len(data)), [r.short for r, _ in data], fontsize=8)
    ax.invert_yaxis()
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlim(min([0] + offsets) - 1, far + 1)
    ticks = [t for t in ax.get_xticks() if t < far - 0.5 and t == int(t)]
    ax.set_xticks(ticks + [far], [str(int(t)) for t in ticks] + ["never"])
    ax.set_xlabel("output index of </think> minus the index the budget puts it at "
                  "(0: exact; every request of every run)")
    ax.grid(axis="x", alpha=.3)
    ax.set_title("Where </think> came (green: honoured, red X: violated; right: requests "
                 "honoured)", fontsize=10)
    return png(fig)


def plot_timings(runs: list[Run]) -> str | None:
    plt = _plt()
    data = [(r.short, time_parts(r), r.row.get("wall_s") or 0.0) for r in runs]
    data = [d for d in data if d[1]]
    if not data:
        return None
    labels = list(dict.fromkeys(lab for d in data for lab, _ in d[1]))
    fig, ax = plt.subplots(figsize=(10, 0.3 * len(data) + 1.8))
    left = [0.0] * len(data)
    for lab, color in zip(labels, part_colors(len(labels))):
        vals = [dict(d[1]).get(lab, 0.0) for d in data]
        ax.barh(range(len(data)), vals, left=left, label=lab, color=color)
        left = [a + b for a, b in zip(left, vals)]
    ax.scatter([d[2] for d in data], range(len(data)), marker="x", color="k",
               label="run wall time")
    ax.set_yticks(range(len(data)), [d[0] for d in data], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=3, fontsize=7)
    return png(fig)


def part_colors(n: int) -> list:
    """``n`` distinct colours, one per part of the time chart (tab20's 20, then evenly spaced
    hues): no two parts share one, whatever the number of parts."""
    plt = _plt()
    if n <= 20:
        cmap = plt.get_cmap("tab20")
        order = list(range(0, 20, 2)) + list(range(1, 20, 2))  # the strong tones first
        return [cmap(i) for i in order[:n]]
    import colorsys

    return [colorsys.hsv_to_rgb(i / n, 0.65, 0.85) for i in range(n)]
