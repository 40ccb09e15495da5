"""The ``workbook`` command: run an environment's matrix, verify a run folder, write a report.

    workbook run ENV [--only NAME ...] [--timeout S] [--out outputs] [--set KEY=VALUE ...]
                     [--no-report] [--in-process] [--probes]
                     # prints the report's path, then the folder
    workbook validate ENV [--set KEY=VALUE ...]     # check every run, start nothing
    workbook verify RUN_DIR                          # SHA256SUMS; exit 1 on any mismatch
    workbook report [RUN_DIR ...] [-o FILE] [--out outputs]
    workbook params NOTEBOOK                         # the notebook's parameters (papermill)

Exit codes: 0 success, 1 a run failed / a checksum mismatched, 2 a configuration error (raised
before any engine starts). Argument parsing only: the work is in ``workbook.batch`` and
``workbook.report``.
"""

from __future__ import annotations

import argparse
import os
import sys

from workbook.core.config import ConfigError


def _set_pair(text: str) -> tuple[str, object]:
    import yaml

    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--set wants KEY=VALUE, got {text!r}")
    return key.strip(), yaml.safe_load(value)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="workbook", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run an environment's parameter matrix with papermill")
    r.add_argument("env", help="environment name (environments/<ENV>.yaml) or a yaml path")
    r.add_argument("--only", nargs="+", metavar="NAME", help="run only these runs")
    r.add_argument("--timeout", type=float, help="per-run timeout in seconds (overrides yaml)")
    r.add_argument("--out", default="outputs", help="output root (default: outputs)")
    r.add_argument("--set", dest="overrides", action="append", type=_set_pair, default=[],
                   metavar="KEY=VALUE", help="override a RunConfig field for every run (YAML)")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    r.add_argument("--no-report", action="store_true", help="no report.html in the run folder")
    r.add_argument("--probes", action="store_true",
                   help="after a violation, run the probes that confirm its cause (sets "
                        "probes=true for every run)")
    r.add_argument("--in-process", action="store_true",
                   help="all runs in this process, engines shared, no papermill "
                        "(executor in-process; e.g. a GPU host without the notebook stack)")
    v = sub.add_parser("validate", help="validate every run of an environment; start nothing")
    v.add_argument("env")
    v.add_argument("--set", dest="overrides", action="append", type=_set_pair, default=[],
                   metavar="KEY=VALUE")
    c = sub.add_parser("verify", help="check a run folder against its SHA256SUMS")
    c.add_argument("run_dir")
    rep = sub.add_parser("report", help="write the HTML report and print its path")
    rep.add_argument("run_dirs", nargs="*", metavar="RUN_DIR",
                     help="run folders (default: the latest run of each hardware under --out)")
    rep.add_argument("-o", "--output", help="HTML file (default: <out>/reports/report-<time>.html)")
    rep.add_argument("--out", default="outputs", help="output root (default: outputs)")
    n = sub.add_parser("params", help="show a notebook's parameters (papermill --help-notebook)")
    n.add_argument("notebook")
    return p


def cmd_run(args) -> int:
    from workbook import batch
    from workbook.core import rundir

    overrides = dict(args.overrides)
    if args.probes:
        overrides["probes"] = True
    env = batch.load_environment(args.env, overrides, notebooks=not args.in_process)
    batch.select(env, args.only)
    run_dir = batch.execute(env, out=args.out, only=args.only, timeout=args.timeout,
                            progress=not args.no_progress, report=not args.no_report,
                            executor="in-process" if args.in_process else "papermill")
    manifest = rundir.read_json(os.path.join(run_dir, rundir.MANIFEST))
    if os.path.exists(os.path.join(run_dir, rundir.REPORT)):
        print(f"report: {os.path.join(run_dir, rundir.REPORT)}")
    print(run_dir)  # last line: the run folder
    return 0 if manifest["status"] == "ok" else 1


def cmd_validate(args) -> int:
    from workbook import batch

    env = batch.load_environment(args.env, dict(args.overrides))
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


def cmd_report(args) -> int:
    from workbook import batch, report

    run_dirs = args.run_dirs or batch.latest_runs(args.out)
    if not run_dirs:
        print(f"no run folders under {args.out}", file=sys.stderr)
        return 2
    path = report.write(run_dirs, args.output or report.default_path(args.out))
    print(path)
    return 0


def cmd_params(args) -> int:
    from papermill.inspection import display_notebook_help
    import click

    from workbook import batch

    tmp, _ = batch.read_notebook(os.path.abspath(args.notebook))
    ctx = click.Context(click.Command("papermill"))
    return int(display_notebook_help(ctx, tmp, None) or 0)


COMMANDS = {"run": cmd_run, "validate": cmd_validate, "verify": cmd_verify,
            "report": cmd_report, "params": cmd_params}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except ConfigError as e:
        print(f"workbook: configuration error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
