"""The upstream report: a violation as markdown ready to file with vLLM.

``document`` lays out its sections in order: title; the status (known / new / intended /
planted / registered); what vLLM promises and where (doc / API / test link); what happens; the
reproducer on plain vLLM, embedded whole, with the command and its recorded output; the first
violating step and row; the versions; the environment as ``vllm collect-env`` gives it
(``collect_env`` runs it from the installed vLLM where nothing was recorded); the upstream search
the user should repeat (GitHub searches of issues and pull requests), with the links the
workbook found. A report shared alone works: nothing in it points into the clone, and absolute
paths of this machine are replaced (``scrub``).

Not here: what goes into it — a registered finding (``workbook.report.findings.report_markdown``,
``workbook findings report ID``), a run folder's verdict (``workbook.report.issue``,
``workbook report-issue``); judging (the contracts).
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
import urllib.parse

GITHUB_SEARCH = "https://github.com/search?type={kind}&q={q}"
COLLECT_ENV_TIMEOUT_S = 180


def scrub(text: str) -> str:
    """``text`` without this machine's absolute paths: the clone, the home folder, the Python
    prefix, temporary and cache folders become ``<repo>``, ``~``, ``<python>``, ``<path>``."""
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    subs = [(repo, "<repo>"), (sys.prefix, "<python>"), (os.path.expanduser("~"), "~")]
    for real, alias in sorted(subs, key=lambda x: -len(x[0])):
        if real and real not in ("/", "~"):
            text = text.replace(real, alias)
    return re.sub(r"(?<![\w.<>~])/(?:tmp|work|root|home|var/folders|private)/[^\s'\",)\]]*",
                  "<path>", text)


@functools.lru_cache(maxsize=1)
def collect_env(timeout: float = COLLECT_ENV_TIMEOUT_S) -> str:
    """``vllm collect-env`` of the installed vLLM (``python -m vllm.collect_env``), scrubbed;
    one line saying why when it cannot run (once per process)."""
    try:
        p = subprocess.run([sys.executable, "-m", "vllm.collect_env"], capture_output=True,
                           text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"(vllm collect-env could not run here: {type(e).__name__}: {e})"
    if p.returncode != 0 or not p.stdout.strip():
        last = (p.stderr.strip().splitlines() or ["no output"])[-1]
        return f"(vllm collect-env failed here: exit {p.returncode}: {last})"
    return scrub(p.stdout.strip())


def search_links(query: str, repo: str = "vllm-project/vllm") -> str:
    """GitHub searches of ``repo``'s issues and pull requests (open and closed) for ``query``."""
    q = urllib.parse.quote_plus(f"repo:{repo} {query}")
    return (f"[issues]({GITHUB_SEARCH.format(kind='issues', q=q)}) · "
            f"[pull requests]({GITHUB_SEARCH.format(kind='pullrequests', q=q)})")


def fence(text: str, lang: str = "") -> str:
    ticks = "```" + ("`" * max((len(m) - 2 for m in re.findall(r"`{3,}", text)), default=0))
    return f"{ticks}{lang}\n{text.rstrip()}\n{ticks}"


def document(*, title: str, status: list[str], promise: str, happens: list[str],
             repro: str, command: str, output: str, output_note: str, first: str,
             versions: str, environment: str, search: list[str], links: list[str]) -> str:
    """The report's sections in order, as markdown (every argument a filled sentence or
    block: the callers say what is absent)."""
    out = [f"# {title}", "", *status, "", "## What vLLM promises", "", promise, "",
           "## What happens", "", *happens, "", "## Reproducer (plain vLLM, no workbook)", "",
           fence(repro, "python"), "", "Run it with:", "", fence(command, "bash"), "",
           "### Its output", "", output_note, "", fence(output, "text"), "",
           "## First violating step and row", "", first, "", "## Versions", "", versions, "",
           "## Environment (`vllm collect-env`)", "", fence(environment, "text"), "",
           "## Upstream search", "",
           "Search vLLM's tracker — issues AND pull requests, open, closed and merged — by "
           "mechanism and by the component's file and function names before filing:", "",
           *[f"- `{q}` — {search_links(q)}" for q in search], ""]
    if links:
        out += ["Found by the workbook:", "", *[f"- {x}" for x in links], ""]
    return "\n".join(out).rstrip() + "\n"
