"""The two ways the pipeline reaches vLLM: an in-process engine, or ``vllm serve``.

A backend does, for ``workbook.run.pipeline``: ``start()`` (engine / server up, hooks in),
``effective()``, ``reported()`` (the reported request → ``Outcome`` list), ``check(name)``,
``frames(n_tokens)`` (the trace of this run's requests), ``stop()`` (hooks out / server
down), ``save_files(outdir)`` (its own evidence: ``server.log``), ``timings`` and ``handle``
(the ``Engine`` or ``Server``, for a notebook that explores further).

``BACKENDS`` maps ``RunConfig.mode`` to the class. Not here: the steps and the evidence files
(``pipeline``), the server process itself (``server``), the request (``request``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil

from workbook import hooks
from workbook.run import request
from workbook.run import server as srv
from workbook.vllm import engine


class InProcess:
    """vLLM in this process (``vllm.LLM``), shared with every run of the same engine
    configuration; the run's fault, guard and tracer installed for the run only."""

    name = "in-process"

    def __init__(self, cfg, outdir=None, engine=None):
        self.cfg = cfg
        # a given (shared) engine, seen with this run's request parameters
        self.engine = None if engine is None else dataclasses.replace(engine, cfg=cfg)
        self.hooks: list = []
        self.tracer = None
        self.timings: dict[str, float] = {}

    @property
    def handle(self):
        return self.engine

    def start(self) -> None:
        if self.engine is None:
            shared = engine.shared(self.cfg)
            self.timings.update(shared.timings)
            # the shared vLLM engine, seen with this run's request parameters (budget, prompt,
            # sampling): a shared engine keeps the configuration it was started with
            self.engine = dataclasses.replace(shared, cfg=self.cfg)
        self.hooks, self.tracer = hooks.install(self.cfg, engine=self.engine)

    def effective(self) -> dict:
        return dict(self.engine.effective)

    def _weights(self):
        return request.zeroed_lm_head(self.engine) if self.cfg.zero_lm_head \
            else contextlib.nullcontext()

    def reported(self) -> list:
        with self._weights():
            return request.run_reported(self.engine)

    def check(self, name: str) -> list:
        return request.CHECKS[name](self.engine)

    def frames(self, n_tokens: int) -> dict:
        return self.tracer.frames() if self.tracer is not None else {}

    def stop(self) -> None:
        for h in reversed(self.hooks):
            h.remove()
        self.hooks = []

    def save_files(self, outdir: str) -> None:
        return None


class Served:
    """The reported request through vLLM's OpenAI-compatible server, as #54906 was reported.

    Hooks reach vLLM's processes through the plugin; with ``server`` (a running
    ``workbook.run.server.Server`` for the same engine configuration) it is reused and left
    running, and the run reads only the traces of the requests it sent."""

    name = "server"

    def __init__(self, cfg, outdir=None, server=None, port=None):
        self.cfg = cfg
        self.own = server is None
        self.server = server or srv.Server(cfg, outdir, port=port)
        self.before: set = set()
        self.timings: dict[str, float] = {}
        self._sent = False  # the worker writes its effective.json on its first request

    @property
    def handle(self):
        return None if self.own else self.server

    def start(self) -> None:
        if self.own:
            self.server.start()
        else:
            srv.check_compatible(self.server, self.cfg)
        self.timings.update(self.server.timings)
        self.before = srv.traced_req_ids(self.server.frames())

    def effective(self) -> dict:
        return srv.effective(self.server, wait_s=10.0 if self._sent else 0.0)

    def reported(self) -> list:
        self._sent = True
        resp = self.server.chat(self.cfg)
        return [srv.outcome_from_response(resp, self.cfg, self.effective(),
                                          self.server.detokenize)]

    def check(self, name: str) -> list:
        return request.CHECKS[name](self.engine)

    def frames(self, n_tokens: int) -> dict:
        return self.tracer.frames() if self.tracer is not None else {}

    def stop(self) -> None:
        for h in reversed(self.hooks):
            h.remove()
        self.hooks = []

    def save_files(self, outdir: str) -> None:
        return None


class Served:
    """The reported request through vLLM's OpenAI-compatible server, as #54906 was reported.

    Hooks reach vLLM's processes through the plugin; with ``server`` (a running
    ``workbook.run.server.Server`` for the same engine configuration) it is reused and left
    running, and the run reads only the traces of the requests it sent."""

    name = "server"

    def __init__(self, cfg, outdir=None, server=None, port=None):
        self.cfg = cfg
        self.own = server is None
        self.server = server or srv.Server(cfg, outdir, port=port)
        self.before: set = set()
        self.timings: dict[str, float] = {}
        self._sent = False  # the worker writes its effective.json on its first request

    @property
    def handle(self):
        return None if self.own else self.server

    def start(self) -> None:
        if self.own:
            self.server.start()
        else:
            srv.check_compatible(self.server, self.cfg)
        self.timings.update(self.server.timings)
        self.before = srv.traced_req_ids(self.server.frames())

    def effective(self) -> dict:
        if self._effective is None or "runner_class" not in self._effective:
            self._effective = srv.effective(self.server, wait_s=0.5)
        return self._effective

    def reported(self) -> list:
        resp = self.server.chat(self.cfg)
        self._effective = None  # the worker writes effective.json on its first request
        eff = self.effective_after_request()
        return [srv.outcome_from_response(resp, self.cfg, eff, self.server.detokenize)]

    def effective_after_request(self) -> dict:
        self._effective = srv.effective(self.server)
        return self._effective

    def check(self, name: str) -> list:
        return srv.check_a(self.server, self.cfg)

    def frames(self, n_tokens: int) -> dict:
        mrv2 = self.effective().get("runner_is_v2") is not False
        return srv.await_trace(self.server, self.before, n_tokens,
                               timeout=15.0 if mrv2 else 0.0)

    def stop(self) -> None:
        if self.own:
            self.server.stop()
        self.timings.update(self.server.timings)

    def save_files(self, outdir: str) -> None:
        log = self.server.log_path
        dst = os.path.join(outdir, "server.log")
        if os.path.exists(log) and os.path.abspath(dst) != os.path.abspath(log):
            shutil.copyfile(log, dst)


BACKENDS = {"in-process": InProcess, "server": Served}
