"""The ``workbook`` command: run an environment's matrix, verify a run folder, write a report.

    workbook run ENV [--only NAME ...] [--timeout S] [--out outputs] [--set KEY=VALUE ...]
                     [--no-report] [--in-process] [--hide-code] [--no-notebook-html]
                     [--probes] [--[no-]progress]   # prints the finding, the report's path,
                                                    # then the folder
    workbook run constraints [--only NAME] [--methods M ...] [--constraints C ...]
                     [--batches B ...] [--set KEY=VALUE ...] [--out outputs] [--no-report]
                                                    # a constraints grid (an environment
                                                    # with study: constraints; workbook.run.constraints.grid)
    workbook validate ENV [--only NAME ...] [--set KEY=VALUE ...] [--platform cpu|gpu]
                                                    # the run's rules; start nothing
    workbook verify RUN_DIR                          # SHA256SUMS; exit 1 on any mismatch
    workbook report [RUN_DIR ...] [-o FILE] [--out outputs]
    workbook params NOTEBOOK                         # the notebook's parameters (papermill)
    workbook watch [--env ENV [--run NAME]] [--set KEY=VALUE ...] [--localize auto|none|module|op]
                   [--sanitize [auto|nvtx|api|page]] [--caching on|off]
                   [--out DIR]                      # who overwrites the budget state (#54906)
    workbook check-server URL [--model NAME] [--json FILE]  # a running server, nothing installed
    workbook serve [ENV] [--only RUN] [--set KEY=VALUE ...] [--port N]
                   [--logprobs-mode MODE]            # vllm serve for a run, until Ctrl-C
    workbook findings [report ID [-o FILE]]          # the findings, triaged; one's upstream report
    workbook report-issue SOURCE [--cell KEY] [-o FILE]  # a violation's upstream report

Exit codes: 0 success, 1 a run failed / a checksum mismatched, 2 a configuration error (raised
before any engine starts, one line naming the bad name or value) or nothing to report, 128 + N a batch stopped by signal N (130
Ctrl-C, 143 SIGTERM: the interrupted run has a failure row, the manifest and SHA256SUMS are
written). ``--set`` applies to (and is validated against) the runs ``--only`` selects; ``validate``
applies exactly the rules the run applies (``workbook.core.config.validate`` with the platform
and the run's checks). The progress bar is drawn only when stdout and stderr are terminals; a
redirected log gets one line per finished run. Argument parsing only: the work is in
``workbook.batch`` and ``workbook.report``. A subcommand is a ``build_parser`` entry plus a
``cmd_<name>(args) -> int`` in ``COMMANDS``.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

from workbook.core import progress
from workbook.core.config import ConfigError, RunConfig


def _set_pair(text: str) -> tuple[str, object]:
    import yaml

    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--set wants KEY=VALUE, got {text!r}")
    return key.strip(), yaml.safe_load(value)


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error (``prog: error: ...``, exit 2), no usage block."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see: {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="workbook", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    from workbook.core import envfiles
    from workbook.run.constraints import grid

    envs = ", ".join(envfiles.environment_names())
    r = sub.add_parser("run", help="run an environment's parameter matrix with papermill",
                       epilog="exit codes: a batch — 0 every run finished, 1 a run failed, 2 "
                              "bad input (one line, before anything starts), 128 + N stopped "
                              "by signal N (130 Ctrl-C); a constraints grid — "
                              + grid.EXIT_CODES.removeprefix("exit codes: "))
    r.add_argument("env", help=f"environment name (environments/<ENV>.yaml: {envs}) or a yaml "
                               "path; 'constraints' is the constraints grid")
    r.add_argument("--only", nargs="+", metavar="NAME",
                   help="run only these runs (`workbook validate ENV` lists them; the "
                        f"constraints grid's entries: {grid.help_choices()['entries']})")
    r.add_argument("--timeout", type=float, help="per-run timeout in seconds (overrides yaml)")
    r.add_argument("--out", default="outputs", help="output root (default: outputs)")
    r.add_argument("--set", dest="overrides", action="append", type=_set_pair, default=[],
                   metavar="KEY=VALUE", help="override a RunConfig field for every selected "
                                             "run (YAML)")
    progress.add_arguments(r)
    r.add_argument("--no-report", action="store_true", help="no report.html in the run folder")
    r.add_argument("--probes", action="store_true",
                   help="after a violation, run the probes that confirm its cause (sets "
                        "probes=true for every run)")
    r.add_argument("--in-process", action="store_true",
                   help="all runs in this process, engines shared, no papermill "
                        "(executor in-process; e.g. a GPU host without the notebook stack)")
    r.add_argument("--executor", choices=("papermill", "papermill-warm"),
                   help="how each run is executed (default: the environment's `executor`, else "
                        "papermill: a process per run; papermill-warm: one warm kernel)")
    r.add_argument("--hide-code", action="store_true",
                   help="render each executed notebook to HTML without its code cells")
    r.add_argument("--no-notebook-html", action="store_true",
                   help="do not render the executed notebooks to HTML")
    grid.add_arguments(r)
    v = sub.add_parser("validate", help="validate an environment's runs with the rules the run "
                                        "applies; start nothing")
    v.add_argument("env")
    v.add_argument("--only", nargs="+", metavar="NAME", help="validate only these runs")
    v.add_argument("--platform", choices=["cpu", "gpu"],
                   help="apply this platform's rules (default: this machine's, as the run does)")
    v.add_argument("--set", dest="overrides", action="append", type=_set_pair, default=[],
                   metavar="KEY=VALUE", help="override a RunConfig field for every selected "
                                             "run (YAML)")
    c = sub.add_parser("verify", help="check a run folder against its SHA256SUMS")
    c.add_argument("run_dir")
    rep = sub.add_parser("report", help="write the HTML report and print its path")
    rep.add_argument("run_dirs", nargs="*", metavar="RUN_DIR",
                     help="batch folders (outputs/<hw>/<run-id>; a folder holding such "
                          "folders stands for the latest finished one of each hardware; "
                          "default: the latest of each hardware under --out)")
    rep.add_argument("-o", "--output", help="HTML file (default: <out>/reports/report-<time>.html)")
    rep.add_argument("--out", default="outputs", help="output root (default: outputs)")
    n = sub.add_parser("params", help="show a notebook's parameters (papermill --help-notebook)")
    n.add_argument("notebook", help="a notebook (.py percent or .ipynb)")
    w = sub.add_parser("watch", help="start-up watch of the budget state + writer localization "
                                     "(workbook.run.writer.command)")
    w.add_argument("--env", help="take the configuration from an environment file's defaults "
                                 "(and --run's entry)")
    w.add_argument("--run", help="the environment's run to take (default: its 'integrity' run, "
                                 "else its defaults)")
    w.add_argument("--set", dest="overrides", action="append", type=_set_pair, default=[],
                   metavar="KEY=VALUE", help="a RunConfig field (YAML)")
    w.add_argument("--localize", default="auto", choices=["auto", "none", "module", "op"],
                   help="auto: module level, then op level inside the module it names")
    w.add_argument("--timeout", type=float, help="seconds per start-up (the pass keeps what it "
                                                 "narrowed down to)")
    w.add_argument("--out", help="output folder (default: outputs/watch/<time>)")
    w.add_argument("--checks", nargs="*", choices=["A", "B"], default=None,
                   help="deterministic checks after the request (default: the run's)")
    w.add_argument("--sanitize", nargs="?", const="auto", default="none",
                   choices=["none", "auto", "nvtx", "page", "api"],
                   help="name any writer into the budget state. A bare --sanitize (auto): "
                        "on a GPU a pass under compute-sanitizer with the markers read-only "
                        "(NVTX permissions: kernels of any library), then, since CUPTI cannot "
                        "subscribe beside it, a second start-up with CUPTI's callbacks (copies "
                        "and memsets through the CUDA API) unless the first settled it; on a "
                        "CPU read-only pages (every store). nvtx / api / page: one form alone")
    w.add_argument("--caching", choices=["on", "off"], default=None,
                   help="GPU layout: PyTorch's caching allocator on or off for the passes")
    progress.add_arguments(w)
    _check_server_parser(sub)
    _serve_parser(sub)
    from workbook.report import issue  # findings, report-issue (workbook.report.issue)

    issue.add_parsers(sub)
    return p


def cmd_run(args) -> int:
    from workbook import batch
    from workbook import report as rep
    from workbook.core import rundir
    from workbook.run.constraints import grid

    overrides = dict(args.overrides)
    chosen = [o for o in ("methods", "constraints", "batches", "axes", "vary")
              if getattr(args, o, None)]
    if grid.is_grid(args.env):
        if args.probes or args.timeout is not None:
            raise ConfigError("--probes / --timeout are for notebook runs; a constraints grid "
                              "takes --only, --methods, --constraints, --batches, --set")
        return grid.command(args.env, overrides, only=args.only, methods=args.methods,
                            constraints=args.constraints, batches=args.batches, out=args.out,
                            axes=getattr(args, "axes", None), vary=getattr(args, "vary", None),
                            report=None if args.no_report else rep.write,
                            progress=args.progress)
    if chosen:
        raise ConfigError(f"--{chosen[0]} is for a constraints grid (an environment with "
                          f"study: constraints); {args.env} is not one")
    if args.probes:
        overrides["probes"] = True
    env = batch.load_environment(args.env, overrides, notebooks=not args.in_process,
                                 only=args.only)
    run_dir = batch.execute(env, out=args.out, only=args.only, timeout=args.timeout,
                            progress=progress.enabled(args.progress),
                            report=None if args.no_report else functools.partial(
                                rep.write, committed=True),
                            executor="in-process" if args.in_process else (
                                getattr(args, "executor", None) or env.raw.get("executor", "papermill")),
                            hide_code=args.hide_code, notebook_html=not args.no_notebook_html)
    manifest = rundir.read_json(os.path.join(run_dir, rundir.MANIFEST))
    _print_finding(run_dir)
    if os.path.exists(os.path.join(run_dir, rundir.REPORT)):
        print(f"report: {os.path.join(run_dir, rundir.REPORT)}")
    intr = manifest.get("interrupted")
    if intr:
        import signal

        rundir.ignore_late_signals()

        print(f"workbook: interrupted by {intr['signal']} during run {intr.get('run')}; "
              f"the run folder is complete (manifest, SHA256SUMS): {run_dir}", file=sys.stderr)
        print(run_dir)
        return 128 + int(getattr(signal, intr["signal"], signal.SIGINT))
    print(run_dir)  # last line: the run folder
    return 0 if manifest["status"] == "ok" else 1


def _print_finding(run_dir: str) -> None:
    """The batch's finding (the report's headline, one line per violated run) on stdout."""
    from workbook.report import finding, runs

    try:
        lines = finding.terminal_lines(finding.finding([runs.load_batch(run_dir)]))
    except Exception as e:  # the folder is written; never lose its path over a sentence
        lines = [f"workbook: the finding could not be read ({type(e).__name__}: {e}); "
                 "see the report"]
    print("\n".join(lines), flush=True)


def cmd_validate(args) -> int:
    from workbook import batch

    on_cpu = None if args.platform is None else args.platform == "cpu"
    from workbook.run.constraints import grid

    if grid.is_grid(args.env):  # the grid's own plan: what `workbook run constraints` applies
        for name in args.only or grid.entries(args.env):
            p = grid.plan(args.env, dict(args.overrides), only=name, on_cpu=on_cpu)
            print(f"ok  {name}  (constraints grid: {', '.join(p.methods)}; "
                  f"{len(p.constraints)} constraint(s); {', '.join(p.batches)}"
                  + (f"; constraint fault {p.fault})" if p.fault else ")"))
        return 0
    env = batch.load_environment(args.env, dict(args.overrides), only=args.only, on_cpu=on_cpu)
    for spec in env.runs:
        print(f"ok  {spec.name}  ({os.path.relpath(spec.notebook)}, checks={spec.checks})")
    return 0


def cmd_verify(args) -> int:
    from workbook import batch

    problems = batch.verify(args.run_dir)
    for line in problems:
        print(line, file=sys.stderr)
    if not problems:
        print(f"ok: {args.run_dir}")
    return 1 if problems else 0


def _batch_folders(path: str) -> tuple[list[str], list[str]]:
    """(batch folders ``path`` stands for, unfinished newer ones skipped): a batch folder
    itself; or a hardware folder / an output root — the latest finished batch of each
    hardware (``workbook.core.rundir.finished``: closed manifest and ``SHA256SUMS``)."""
    from workbook.core import rundir

    def subdirs(d):
        return [os.path.join(d, x) for x in sorted(os.listdir(d))
                if os.path.isdir(os.path.join(d, x))]

    if os.path.exists(os.path.join(path, rundir.MANIFEST)):
        return [path], []
    found, skipped = [], []
    for group in [path] + subdirs(path):
        batches = [d for d in subdirs(group) if os.path.exists(os.path.join(d, rundir.MANIFEST))
                   and not _study(d)]
        done = [d for d in batches if rundir.finished(d)]
        skipped += [d for d in batches if d not in done and (not done or d > done[-1])]
        if done:
            found.append(done[-1])
    return found, skipped


def _study(folder: str) -> str | None:
    """The study a run folder holds (``constraints``: a grid, ``workbook.run.constraints.grid``), else None
    (a batch of notebook runs)."""
    from workbook.core import rundir

    return (rundir.read_json(os.path.join(folder, rundir.MANIFEST), {}) or {}).get("study")


def _latest_grids(root: str) -> list[str]:
    """The newest finished constraints-grid run folder of each hardware under ``root``."""
    from workbook.core import rundir

    found = []
    for hw in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        base = os.path.join(root, hw)
        if not os.path.isdir(base):
            continue
        grids = [d for d in (os.path.join(base, x) for x in sorted(os.listdir(base)))
                 if _study(d) == "constraints" and rundir.finished(d)]
        found += grids[-1:]
    return found


def cmd_report(args) -> int:
    from workbook import report

    wanted = args.run_dirs or [args.out]
    run_dirs, skipped = [], []
    for path in wanted:
        if not os.path.isdir(path):
            print(f"workbook report: {path}: no such folder", file=sys.stderr)
            return 2
        found, skip = _batch_folders(path)
        run_dirs += found
        skipped += skip
    for d in skipped:
        print(f"workbook report: skipped unfinished batch folder (no closed manifest or no "
              f"SHA256SUMS): {d}", file=sys.stderr)
    if not run_dirs:
        print(f"workbook report: no batch folders with runs in {', '.join(wanted)} (a batch "
              "folder is outputs/<hardware>/<run-id>, written by `workbook run`)",
              file=sys.stderr)
        return 2
    try:
        # constraints grids: in the folders given, else under <out>/<hardware>/constraints-*/
        # (and the newest grid run folder of each hardware: `workbook run constraints`)
        grid_paths = list(args.run_dirs) if args.run_dirs else [
            os.path.join(args.out, d) for d in sorted(os.listdir(args.out))
            if os.path.isdir(os.path.join(args.out, d))] + _latest_grids(args.out)
        path = report.write(run_dirs, args.output or report.default_path(args.out),
                            grid_paths=grid_paths)
    except report.NoRuns as e:
        print(f"workbook report: {e}: nothing to report", file=sys.stderr)
        return 2
    print(path)
    return 0


def cmd_params(args) -> int:
    from workbook import batch

    path = os.path.abspath(args.notebook)
    if not os.path.isfile(path):
        print(f"workbook params: {args.notebook}: no such notebook", file=sys.stderr)
        return 2
    try:
        _, params = batch.read_notebook(path)
    except Exception as e:
        print(f"workbook params: {args.notebook}: not a notebook ({type(e).__name__}: {e})",
              file=sys.stderr)
        return 2
    print(f"Usage: workbook run ENV --set NAME=VALUE ...   or   papermill "
          f"{os.path.splitext(os.path.relpath(path))[0]}.ipynb OUT.ipynb -p NAME VALUE ...")
    print(f"\nParameters of {os.path.relpath(path)}:")
    if not params:
        print("\n  (no cell tagged 'parameters')")
        return 1
    for name, p in params.items():
        kind = p.get("inferred_type_name") or "Unknown type"
        definition = f"  {name}: {'Unknown type' if kind == 'None' else kind} " \
                     f"(default {p.get('default')})"
        print(f"{definition:<48}{p.get('help') or ''}" if len(definition) < 48
              else f"{definition}\n{48 * ' '}{p.get('help') or ''}")
    return 0


def cmd_watch(args) -> int:
    import time

    from workbook.core.config import RunConfig, validate
    from workbook.run.writer import command as watchcmd
    from workbook.vllm import env as wenv

    _known_keys(args.overrides)
    checks = args.checks or []
    if args.env:
        cfg, env_checks = watchcmd.from_environment(args.env, args.run, dict(args.overrides))
        if args.checks is None:
            checks = env_checks
    else:
        cfg = RunConfig.from_params(dict(args.overrides))
    cfg = cfg.replace(watch=True)
    if args.sanitize != "none":
        cfg = cfg.replace(sanitize=args.sanitize)
    if args.localize in ("module", "op", "auto") and not cfg.enforce_eager:
        print("workbook watch: localization runs the engine eager (enforce_eager=True); "
              "#54906 fails eager too", file=sys.stderr)
        cfg = cfg.replace(enforce_eager=True)
    validate(cfg.replace(localize="module" if args.localize == "auto" else args.localize),
             on_cpu=wenv.on_cpu())
    out = os.path.abspath(args.out or os.path.join("outputs", "watch",
                                                   time.strftime("%Y%m%d-%H%M%S")))
    args.record = f"the passes' evidence so far is under {out}"
    with progress.Progress(None, "watch",  # passes: how many, the first ones decide
                           progress.enabled(args.progress), unit="pass") as bar:
        result = watchcmd.run_passes(cfg, out, args.localize, timeout_s=args.timeout,
                                     checks=checks, caching=args.caching, progress=bar)
    watchcmd.print_summary(result, out)
    return 0 if all(p.get("rc") == 0 or p.get("writer") for p in result["passes"]) else 1


def _known_keys(overrides) -> None:
    """``--set`` keys must be ``RunConfig`` fields (commands without notebook parameters)."""
    fields = RunConfig.field_names()
    unknown = [k for k, _ in overrides if k not in fields]
    if unknown:
        raise ConfigError(f"--set {', '.join(unknown)}: unknown parameter(s); known: "
                          f"{', '.join(fields)}")


# --- serve (workbook.run.servers.serve) ----------------------------------------------------------------

SERVE_PORT = 8000  # vllm serve's own default
SERVE_LOGPROBS_MODES = ("processed_logprobs", "processed_logits", "raw_logprobs", "raw_logits")


def _serve_parser(sub) -> None:
    s = sub.add_parser("serve", help="start `vllm serve` on an environment run's model and "
                                     "configuration, print its URL and the matching "
                                     "check-server line; Ctrl-C stops it")
    s.add_argument("env", nargs="?", default="cpu",
                   help="environment name (environments/<ENV>.yaml) or a yaml path "
                        "(default: cpu)")
    s.add_argument("--only", metavar="RUN",
                   help="the environment's run to serve (default: its first run)")
    s.add_argument("--set", dest="overrides", action="append", type=_set_pair, default=[],
                   metavar="KEY=VALUE", help="override a RunConfig field (YAML)")
    s.add_argument("--port", type=int, default=SERVE_PORT,
                   help=f"port on 127.0.0.1 (default {SERVE_PORT}; 0: a free one)")
    s.add_argument("--logprobs-mode", default="processed_logprobs",
                   choices=SERVE_LOGPROBS_MODES,
                   help="vLLM's --logprobs-mode (default processed_logprobs: check-server "
                        "sees the column the budget forced)")
    s.add_argument("--workdir", help="folder for server.log (default: a temporary folder)")


def cmd_serve(args) -> int:
    from workbook import batch
    from workbook.run.servers import serve

    _known_keys(args.overrides)
    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port {args.port}: not a port (0-65535)")
    env = batch.load_environment(args.env, dict(args.overrides), notebooks=False,
                                 only=[args.only] if args.only else None)
    spec = env.runs[0]
    cfg = serve.server_config(RunConfig.from_params(spec.params), args.logprobs_mode)
    extra = "".join([f", fault {cfg.fault}" if cfg.fault not in (None, "none") else "",
                     ", guard on" if cfg.guard else ""])
    return serve.serve(cfg, port=args.port or None, workdir=args.workdir,
                       label=f"{env.name} run {spec.name!r} ({cfg.model}{extra})")


# --- check-server (workbook.run.servers.check) -------------------------------------------------

def _check_server_parser(sub) -> None:
    from workbook.run.constraints.cases import CONSTRAINTS

    s = sub.add_parser("check-server", help="send the reported request to a running vLLM "
                                            "server and judge its budget per position "
                                            "(installs nothing; workbook.run.servers.check)",
                       epilog="exit codes: 0 honored (--constraints: nothing violated), 1 "
                              "violated, 2 the check could not be made or a wrong setting "
                              "(markers that are not the server's), 3 inconclusive "
                              "(--constraints: a request failed otherwise)")
    s.add_argument("url", help="the server, e.g. http://127.0.0.1:8000")
    s.add_argument("--model", help="served model name (default: the first one served)")
    s.add_argument("--budget", type=int, default=1, help="thinking_token_budget (default 1)")
    s.add_argument("--max-tokens", type=int, default=32, help="max_tokens (default 32)")
    s.add_argument("--prompt", default="What is 1+1?", help="the user message")
    s.add_argument("--logprobs-mode", default="auto",
                   choices=["auto", "processed_logprobs", "processed_logits", "raw"],
                   help="what the server runs (--logprobs-mode); auto: read from the response, "
                        "else from a two-request temperature control")
    s.add_argument("--start", default="<think>", help="reasoning start marker text")
    s.add_argument("--end", default="</think>", help="reasoning end marker text")
    s.add_argument("--marker-ids", metavar="START/END",
                   help="marker token ids instead of the texts, e.g. 248068/248069 "
                        "(comma-separated for multi-token markers)")
    s.add_argument("--timeout", type=float, default=300.0, help="seconds per HTTP request")
    s.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"),
                   help="bearer token (default: $OPENAI_API_KEY)")
    s.add_argument("--json", dest="json_out", help="also write the full result as JSON here")
    s.add_argument("--constraints", nargs="?", const="all", metavar="NAMES",
                   help="check every per-request constraint instead of the budget alone (all, "
                        "or comma-separated case names of: " + ", ".join(CONSTRAINTS)
                        + "; workbook.run.servers.constraints)")
    progress.add_arguments(s)


def cmd_check_server(args) -> int:
    """Exit 0 honored, 1 violated, 3 inconclusive, 2 the check could not be made."""
    import json

    from workbook.core.budget import Markers
    from workbook.run.servers import check as servercheck

    markers = None
    if args.marker_ids:
        try:
            start, end = (tuple(int(t) for t in part.split(",")) for part in
                          args.marker_ids.split("/"))
        except ValueError:
            print(f"workbook check-server: --marker-ids wants START/END token ids, e.g. "
                  f"248068/248069; got {args.marker_ids!r}", file=sys.stderr)
            return 2
        markers = Markers(start, end)
    if args.constraints is not None:
        return _check_server_constraints(args, markers)
    args.record = ("nothing was recorded (check-server writes --json only at its end); the "
                   "server keeps running")
    req = servercheck.Request(prompt=args.prompt, budget=args.budget, max_tokens=args.max_tokens)
    try:
        res = servercheck.check(args.url, args.model, req=req, mode=args.logprobs_mode,
                                markers=markers, start_text=args.start, end_text=args.end,
                                timeout=args.timeout, api_key=args.api_key)
    except servercheck.ServerCheckError as e:
        print(f"workbook check-server: {e}", file=sys.stderr)
        return 2
    print(servercheck.render(res))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(res.to_dict(), f, indent=1)
    if res.verdict == "violated":
        servercheck.report_hints(args.json_out, res.to_dict(), [None])
    return {"honored": 0, "violated": 1}.get(res.verdict, 3)


def _check_server_constraints(args, markers) -> int:
    """Exit 0 nothing violated, 1 a violation, 2 a wrong setting / the check could not be made,
    3 a request failed otherwise."""
    import json

    from workbook.run.servers import check as servercheck
    from workbook.run.servers import constraints as sck

    args.record = ("nothing was recorded (check-server writes --json only at its end); the "
                   "server keeps running")
    try:
        names = sck.parse_names(args.constraints)
        with progress.Progress(len(names), "check-server --constraints",
                               progress.enabled(args.progress), unit="case") as bar:
            res = sck.check_constraints(args.url, args.model, names, mode=args.logprobs_mode,
                                        markers=markers, timeout=args.timeout,
                                        api_key=args.api_key, progress=bar)
    except servercheck.ServerCheckError as e:
        print(f"workbook check-server: {e}", file=sys.stderr)
        return 2
    print(sck.render(res))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(res.to_dict(), f, indent=1)
    bad = [v["case"] for v in res.verdicts if v["status"] == "violated"]
    if bad:
        servercheck.report_hints(args.json_out, res.to_dict(), bad)
    return res.rc


def cmd_findings(args) -> int:
    from workbook.report import issue

    return issue.cmd_findings(args)


def cmd_report_issue(args) -> int:
    from workbook.report import issue

    return issue.cmd_report_issue(args)


COMMANDS = {"run": cmd_run, "validate": cmd_validate, "verify": cmd_verify,
            "report": cmd_report, "params": cmd_params, "watch": cmd_watch,
            "check-server": cmd_check_server, "serve": cmd_serve,
            "findings": cmd_findings, "report-issue": cmd_report_issue}


def main(argv: list[str] | None = None) -> int:
    args = None
    try:  # the parser too: it imports what lists the choices (seconds on a cold start)
        args = build_parser().parse_args(argv)
        return COMMANDS[args.command](args)
    except ConfigError as e:
        print(f"workbook: configuration error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # one line: what was interrupted, where its record is
        from workbook.core import rundir

        rundir.ignore_late_signals()
        what = (f"workbook {args.command}" if args is not None
                else "workbook (before a command started)")
        said = getattr(args, "record", None) or "nothing was started"
        print(f"\n{what}: interrupted (Ctrl-C); {said}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
