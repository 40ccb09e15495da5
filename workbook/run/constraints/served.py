"""The constraints grid over ``vllm serve`` (``--set mode=server``): the same cells, judged the same.

Each engine of the grid is a ``workbook.run.server.Server`` started from the cell's
``RunConfig`` with the row check asked for (``WORKBOOK_ROW_CHECK_DIR``): the plugin installs
``workbook.hooks.observe.served_rows`` inside vLLM's worker — the same ``RowCheck`` in the same observer
as in-process — which writes every registration, step record and prompt row to
``<log dir>/rows/<pid>/rows.jsonl`` and takes each batch's constraint fault from
``rows/control.json``. A batch (``run_batch``): its fault written to the control file; each
request the case's prompt (``constraints.prompt_for`` on the model's own tokenizer, as
in-process) sent concurrently to ``POST /v1/completions`` with the case's keywords
(``serverapi.completion_body``: the one mapping of case keywords to the HTTP API; no
``logprobs`` unless the case asks, as in-process); the records the worker appended since the
batch began read back (``Rows``) and judged by ``constraints.judge_batch`` — ``rowjudge``,
``judge_request``, the one ``Verdict``. A keyword the completions API does not take is the
cell's "not available over HTTP" (nothing sent); an HTTP 4xx is ``refused`` with the server's
message.

The batches on an edited lm_head (``single`` and ``mixed`` zeroed, ``mixed-scaled`` scaled) ask
the worker for the edit in the same control file (``lm_head``): the worker edits its own
lm_heads before the batch's first forward and writes them back when the next batch asks for
another head — the same edit as in-process (``workbook.vllm.lmhead``). The drafter axis' steer
plans go the same way (the worker installs ``hooks.steer`` itself); the preemption axis reads
the preemptions vLLM's scheduler told the worker of (``preempted_req_ids``) and the steered
draft rows from the worker's records; staggered arrival sends request i once the server has run
``2 * i`` steps of the batch (``send``).
What cannot work over a server is refused before any server starts (``refusals``, rc 2): the
CPU async shim (it lives in the process that builds vLLM's configuration), and constraint
faults outside the worker's process.
Not here: the grid's plan, cells and files (``workbook.run.constraints.grid``), judging
(``constraints`` / ``rowjudge``).
"""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

from workbook.core.config import RunConfig

# axis -> why a non-default value cannot run over a server
AXES = {"async_scheduling": "keeps async scheduling on the CPU through an in-process shim",
        # the hunt's request-level axes are sent by the in-process sender only
        # (workbook.run.constraints.axes.generate / cases.run_batch)
        "n": "judges each of n outputs through the in-process row check's child requests",
        "prefix_cache": "primes a shared prefix through the in-process engine",
        "chunked_prefill": "sends long prompts through the in-process sender",
        "abort": "aborts a request between engine steps in-process",
        "priority": "sends request priorities through the in-process engine"}
# constraint faults patching a process the plugin leaves untouched (it hooks model runners)
FAULT_PROCESS = {"stop-string-not-trimmed": "the API front-end's OutputProcessor"}
ENGINE_CORE_FAULTS = ("stop-not-trimmed", "max-tokens-step-end")  # the scheduler


def refusals(base: RunConfig, batches, axes_sel: dict, fault: str | None) -> str | None:
    """Why this grid cannot run with ``mode=server`` (one line), else None."""
    for n, values in axes_sel.items():
        if n in AXES and len(values) > 1:
            return f"axis {n!r}: its non-default value {AXES[n]}; not over a server"
    if base.fault != "none":
        return (f"budget fault {base.fault!r}: a served grid switches only constraint faults "
                "per batch (its healthy reference runs on the same server)")
    if fault in FAULT_PROCESS:
        return (f"constraint fault {fault!r} patches {FAULT_PROCESS[fault]}; the plugin hooks "
                "only vLLM's model-runner processes")
    world = base.tensor_parallel_size * base.pipeline_parallel_size
    if fault in ENGINE_CORE_FAULTS and world > 1:
        return (f"constraint fault {fault!r} patches the scheduler, in the engine-core process "
                "only when the worker runs there (tensor/pipeline parallel 1)")
    return None


def http_fields() -> set[str] | None:
    """The request fields of the installed vLLM's ``CompletionRequest`` (None: unknown)."""
    try:
        from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    except ImportError:
        try:
            from vllm.entrypoints.openai.protocol import CompletionRequest
        except ImportError:
            return None
    return set(CompletionRequest.model_fields)


def not_over_http(kw: dict, fields: set[str] | None) -> list[str]:
    """The case keywords the completions API cannot express (nothing is dropped silently)."""
    if fields is None:
        return []
    return [k for k in kw if k not in fields]


class Rows:
    """The served row check's records (``hooks.served_rows``) appended since ``mark()``, with
    the attributes ``rowjudge.judge`` / ``constraints.judge_request`` read from a
    ``RowCheck``."""

    def __init__(self, folder: str):
        self.folder = folder
        self.offsets: dict[str, int] = {}

    def mark(self) -> None:
        self.offsets = {p: os.path.getsize(p) for p in self._files()}

    def _files(self) -> list[str]:
        from workbook.hooks.observe.served_rows import ROWS

        if not os.path.isdir(self.folder):
            return []
        return [os.path.join(self.folder, d, ROWS) for d in sorted(os.listdir(self.folder))
                if os.path.exists(os.path.join(self.folder, d, ROWS))]

    def read(self) -> "Rows":
        from workbook.core import budget, contracts

        self.params, self.prompts, self.registrations = {}, {}, []
        self.steps, self.errors, self._prompt_rows = [], [], {}
        self.counts: dict[str, dict[tuple, int]] = {"preempted": {}, "steered": {}}
        self.markers, self.logprobs_mode = budget.Markers(), "raw_logprobs"
        for path in self._files():
            with open(path) as f:
                f.seek(self.offsets.get(path, 0))
                text = f.read()
            for line in text.splitlines():
                try:
                    x = json.loads(line)
                except ValueError:
                    continue  # a line still being written
                kind = x.pop("kind", None)
                if kind == "registration":
                    req = x["req_id"]
                    if x.get("params") is not None:
                        self.params[req] = contracts.Params(**x["params"])
                    self.prompts[req] = x.get("prompt") or []
                    self.registrations.append(x["registration"])
                    self.markers = budget.Markers.of(x.get("markers"))
                    self.logprobs_mode = x.get("logprobs_mode") or self.logprobs_mode
                elif kind == "step":
                    self.steps.append(_int_keys(x))
                elif kind == "prompt_rows":
                    self._prompt_rows.setdefault(x["req_id"], {}).update(
                        {int(q): r for q, r in x["rows"].items()})
                elif kind in ("preempted", "steered"):  # the batch's counts so far
                    self.counts[kind] = {tuple(p): int(n) for p, n in x["counts"]}
                elif kind == "error":
                    self.errors.append(x["error"])
        first = min((r["step"] for r in self.steps), default=0)
        for r in self.steps:  # the batch's own step count, from 0 as an in-process batch's
            r["server_step"], r["step"] = r["step"], r["step"] - first
        return self

    def preemptions(self, prompt) -> int:
        """Preemptions vLLM's scheduler told the worker of, for the request with ``prompt``."""
        return self.counts["preempted"].get(tuple(int(t) for t in prompt), 0)

    def steered(self, prompt) -> int:
        """Draft rows the worker's steer replaced for the request with ``prompt``."""
        return self.counts["steered"].get(tuple(int(t) for t in prompt), 0)

    def prompt_rows(self, req_id: str) -> dict[int, dict]:
        return self._prompt_rows.get(req_id, {})

    def emitted_rows(self, req_id: str) -> list[dict]:
        from workbook.hooks.observe.rowcheck import RowCheck

        return RowCheck.emitted_rows(self, req_id)  # the one reading of the step records


def _jsonable(x):
    return json.loads(json.dumps(x, default=str))


def _int_keys(rec: dict) -> dict:
    """JSON made the rows' column keys strings; the judge reads them as token ids."""
    for row in rec.get("rows") or []:
        for k, v in row.items():
            if isinstance(v, dict) and v and all(isinstance(c, str) and c.lstrip("-").isdigit()
                                                 for c in v):
                row[k] = {int(c): x for c, x in v.items()}
    return rec


class ServedEngine:
    """A started server for one grid engine: the tokenizer, the endpoint, the row records."""

    PREEMPTION_COUNTER = "the scheduler's preempted_req_ids, as the worker got them"

    def __init__(self, cfg: RunConfig, log_dir: str | None):
        import tempfile

        from workbook.run import server as srv

        self.cfg = cfg.replace(row_check=True, constraint_fault="none", fault="none",
                               guard=False, trace=False)
        self.dir = log_dir or tempfile.mkdtemp(prefix="workbook-grid-server-")
        self.rows_dir = os.path.join(self.dir, "rows")
        os.makedirs(self.rows_dir, exist_ok=True)
        self.server = srv.Server(self.cfg, self.dir, row_check_dir=self.rows_dir)
        self.seq = 0
        self.fields = None
        self.tokenizer = None

    def start(self) -> "ServedEngine":
        from transformers import AutoTokenizer

        from workbook.vllm import engine as vengine

        kw = vengine.engine_kwargs(self.cfg)
        self.server.start()
        self.tokenizer = AutoTokenizer.from_pretrained(kw.get("tokenizer") or kw["model"])
        self.fields = http_fields()
        return self

    def stop(self) -> None:
        self.server.stop()

    def grammar_for(self, params):
        """(checker, why not, grammar held back until the reasoning ends) of a structured
        request: the grammar compiled from the model folder this server loaded, as vLLM's
        xgrammar backend compiles it (``vllm.grammar.for_model``); the server's reasoning
        parser (``--reasoning-parser``, structured outputs' default ``enable_in_reasoning`` off)
        holds it back."""
        from workbook.vllm import engine as vengine
        from workbook.vllm import grammar as vgrammar

        kw = vengine.engine_kwargs(self.cfg)
        chk, why, _ = vgrammar.for_model(kw.get("tokenizer") or kw["model"], params)
        return chk, why, bool(kw.get("reasoning_parser"))

    @property
    def url(self) -> str:
        return self.server.base_url

    def control(self, fault: str, head: str = "natural", factor: float | None = None,
                steer: dict | None = None) -> None:
        """The next batch's constraint fault, lm_head edit (``vllm.lmhead``) and drafter steer
        plans (prompt tuple -> plan, ``hooks.steer``): the worker reads them at its next step,
        before its forward (``hooks.served_rows``)."""
        from workbook.core import rundir
        from workbook.hooks.observe.served_rows import CONTROL

        self.seq += 1
        rundir.write_json(os.path.join(self.rows_dir, CONTROL),
                          {"seq": self.seq, "constraint_fault": fault or "none",
                           "lm_head": head, "lm_head_factor": factor,
                           "steer": [[list(p), list(v)] for p, v in (steer or {}).items()]})

    def complete(self, prompt: list[int], kw: dict, max_tokens: int) -> dict:
        from workbook.run import serverapi

        body = serverapi.completion_body(self.server.model_id, prompt, kw, max_tokens=max_tokens,
                                    logprobs=0)
        if "logprobs" not in kw:
            body.pop("logprobs")  # as in-process: no logprobs unless the case asks
        body.pop("seed", None)
        return serverapi.Endpoint(self.url, 600.0).post("/v1/completions", body)


def output_of(resp: dict, prompt: list[int]):
    """A completion as the ``RequestOutput`` shape ``judge_request`` reads."""
    from workbook.run import serverapi

    ch = resp["choices"][0]
    lp = None
    if ch.get("logprobs"):
        lp = [{t: SimpleNamespace(logprob=v) for t, v in d.items()}
              for d in serverapi.position_logprobs(ch)]
    comp = SimpleNamespace(token_ids=[int(t) for t in ch.get("token_ids") or []],
                           finish_reason=ch.get("finish_reason"), text=ch.get("text"),
                           logprobs=lp)
    return SimpleNamespace(outputs=[comp], prompt_token_ids=list(prompt),
                           prompt_logprobs=serverapi.returned_prompt_logprobs(resp, ch))


def run_batch(eng: ServedEngine, cfg: RunConfig, cases: dict[str, dict], *, batch: str,
              fault: str | None = None, head: str = "natural", factor: float | None = None,
              steer_plans: dict | None = None) -> tuple[dict, dict]:
    """``cases`` as one batch of concurrent completions on the served engine, under
    constraint fault ``fault`` (default ``cfg.constraint_fault``) on the lm_head edit ``head``
    (``factor`` for ``scaled``), the drafter steered by ``steer_plans`` (case -> plan), the
    requests arriving as ``cfg.arrival`` says (``send``); cells and evidence as
    ``constraints.run_batch`` returns them, with each cell's preemptions and steered draft rows
    as the worker saw them."""
    from workbook.run.constraints import cases as C

    cells: dict = {}
    evidence: dict = {}
    names, prompts = [], []
    for name, kw in cases.items():
        missing = not_over_http(kw, eng.fields)
        if missing:
            cells[name] = C.Cell(name, "", batch, "not available",
                                 f"not available over HTTP: the completions API has no "
                                 f"{', '.join(missing)} (vLLM's CompletionRequest)",
                                 kwargs=_jsonable(kw))
            continue
        names.append(name)
        prompts.append(C.prompt_for(eng.tokenizer, name))
    if not names:
        return cells, evidence
    plans = {tuple(prompts[names.index(n)]): v for n, v in (steer_plans or {}).items()
             if n in names and v}
    eng.control(fault or getattr(cfg, "constraint_fault", "none") or "none", head, factor,
                plans)
    rows = Rows(eng.rows_dir)
    rows.mark()
    results = send(eng, rows, [(p, cases[n]) for n, p in zip(names, prompts)], cfg)
    results = dict(zip(names, results))
    ok, outs = [], []
    for n, p in zip(names, prompts):
        r = results[n]
        if isinstance(r, Exception):
            msg = str(r).split(": ", 1)[-1] if "HTTP" in str(r) else C.one_line(r)
            status = "refused" if "HTTP 4" in str(r) else "error"
            cells[n] = C.Cell(n, "", batch, status, msg[:400], kwargs=_jsonable(cases[n]))
            continue
        ok.append(n)
        outs.append(output_of(r, p))
    if not ok:
        return cells, evidence
    _await_rows(rows, ok, prompts, names, outs)
    sps = [SimpleNamespace(skip_special_tokens=True)] * len(ok)
    C.judge_batch(rows, ok, outs, {n: cases[n] for n in ok}, batch, eng, eng.tokenizer, sps,
                  cells, evidence)
    for n in ok:
        p = prompts[names.index(n)]
        cells[n].preemptions = rows.preemptions(p)
        if plans:
            cells[n].steered = rows.steered(p)
    return cells, evidence


def send(eng: ServedEngine, rows: Rows, requests: list[tuple[list[int], dict]],
         cfg: RunConfig, every: int = 2) -> list:
    """Each ``(prompt, keywords)`` as a completion; the responses (or exceptions) in order.
    ``cfg.arrival`` ``step0``: all at once (concurrent); ``staggered``: request i is sent once
    the server has run ``every * i`` steps of this batch (the worker's step records since
    ``rows.mark()``), or at once when everything sent before it has finished — as in-process
    (``axes.generate``), a batch of one request joins an unconstrained one sent first."""
    from workbook.run.constraints import cases as C

    staggered = getattr(cfg, "arrival", "step0") == "staggered"
    queue = list(requests)
    if staggered and len(queue) == 1:
        queue.insert(0, (C.prompt_for(eng.tokenizer, "nothing"), {}))
    results: list = [None] * len(queue)

    def one(i):
        try:
            results[i] = eng.complete(queue[i][0], queue[i][1], cfg.max_tokens)
        except Exception as e:
            results[i] = e

    with ThreadPoolExecutor(max_workers=len(queue)) as ex:
        if not staggered:
            list(ex.map(one, range(len(queue))))
        else:
            futures = []
            for i in range(len(queue)):
                t0 = time.monotonic()
                while i and not all(f.done() for f in futures) \
                        and len({r["server_step"] for r in rows.read().steps}) < every * i:
                    if time.monotonic() - t0 > 600:
                        raise RuntimeError("staggered arrival: the server ran no step")
                    time.sleep(0.05)
                futures.append(ex.submit(one, i))
            for f in futures:
                f.result()
    return results[len(queue) - len(requests):]


def _await_rows(rows: Rows, ok, prompts, names, outs, timeout: float = 10.0) -> None:
    """Read the records until every finished request's emitted rows are there (the worker
    appends them before the step's output leaves it; a short wait covers file buffering)."""
    want = {tuple(prompts[names.index(n)]): len(o.outputs[0].token_ids) for n, o in
            zip(ok, outs)}
    t0 = time.monotonic()
    while True:
        rows.read()
        by_prompt = {tuple(p): r for r, p in rows.prompts.items()}
        done = all(pr in by_prompt and len(rows.emitted_rows(by_prompt[pr])) >= n
                   for pr, n in want.items())
        if done or time.monotonic() - t0 > timeout:
            return
        time.sleep(0.2)


def baselines(eng: ServedEngine) -> dict[str, list[int]]:
    """The unconstrained greedy output of the baseline prompt per lm_head (``natural``,
    ``zero``, ``scaled``), as ``grid.baselines`` in-process: the worker edits its head per
    request (control file)."""
    from workbook.run.constraints import cases as C

    out = {}
    for head, factor in (("natural", None), ("zero", None), ("scaled", C.SCALE)):
        eng.control("none", head, factor)
        resp = eng.complete(C.prompt_for(eng.tokenizer, "nothing"), {}, 16)
        out[head] = [int(t) for t in resp["choices"][0].get("token_ids") or []]
    eng.control("none")
    return out
