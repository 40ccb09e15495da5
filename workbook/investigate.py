"""One investigation run: engine + hooks + the reported request → evidence files in a folder.

``run(cfg, outdir)`` is what every notebook and the batch runner call. Processing order:

1. validate ``cfg`` (``ConfigError`` before any engine starts) and create ``outdir``;
2. start the engine in-process (or the OpenAI server when ``cfg.mode == "server"``:
   ``workbook.server.run``, which fills the same ``Result`` and files, plus ``server.log``;
   ``engine=`` may then be a running ``workbook.server.Server`` to reuse);
3. install, innermost first, the fault (``cfg.fault``), the guard (``cfg.guard``) and the tracer
   (``cfg.trace``);
4. send the reported request (``workbook.request``) and, when asked, checks A and B;
5. diagnose the trace (``workbook.diagnose``);
6. write the evidence: ``config.json``, ``effective.json``, ``outcome.json``, ``checks.json``,
   ``verdict.json``, ``trace/{steps,requests,rows}.parquet``, ``timings.json``.

Every file is written as soon as it exists, so a run that dies half-way still leaves what it had.
``Result`` holds the same objects in memory for the notebook to display.

Not here: papermill, batches, reports (``workbook.batch``, ``workbook.report``).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any

from workbook.config import RunConfig, validate

FILES = ("config.json", "effective.json", "outcome.json", "checks.json", "verdict.json",
         "timings.json")


def write_json(path: str, obj: Any) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True, default=_jsonable)
    os.replace(tmp, path)


def _jsonable(o):
    if hasattr(o, "to_dict"):
        return o.to_dict()
    if hasattr(o, "tolist"):
        return o.tolist()
    return str(o)


def read_json(path: str, default=None):
    if not os.path.exists(path):
        return default
    with open(path) as f:
        return json.load(f)


@dataclass
class Result:
    cfg: RunConfig
    outdir: str | None
    effective: dict[str, Any] = field(default_factory=dict)
    outcomes: list = field(default_factory=list)
    checks: dict[str, Any] = field(default_factory=dict)
    frames: dict[str, Any] = field(default_factory=dict)
    verdict: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    engine: Any = None

    @property
    def outcome(self):
        return self.outcomes[0] if self.outcomes else None


_ENGINES: dict[str, object] = {}


def engine_for(cfg: RunConfig):
    """An in-process engine for ``cfg``, shared by runs whose engine arguments agree."""
    import json as _json

    from workbook import engine as eng

    key = _json.dumps([eng.engine_kwargs(cfg), cfg.runner, cfg.fault == "H-h"], sort_keys=True,
                      default=str)
    if key not in _ENGINES:
        _ENGINES[key] = eng.start(cfg)
    return _ENGINES[key]


class Session:
    """An engine plus the hooks of one configuration; reusable for several requests.

    ``with Session(cfg) as s: s.reported()`` — the notebook keeps one open to explore.
    """

    def __init__(self, cfg: RunConfig, engine=None):
        self.cfg = validate(cfg)
        self.engine = engine
        self._hooks: list = []
        self.tracer = None

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.remove_hooks()
        return False

    def start(self):
        if self.engine is None:
            self.engine = engine_for(self.cfg)
        self.install_hooks()
        return self

    def install_hooks(self) -> None:
        from workbook import runtime

        self._hooks, self.tracer = runtime.install(self.cfg, engine=self.engine)

    def remove_hooks(self) -> None:
        for h in reversed(self._hooks):
            h.remove()
        self._hooks = []

    def reported(self, **kw):
        from workbook import request

        return request.run_reported(self.engine, **kw)


def run(cfg: RunConfig, outdir: str | None = None, *, checks: tuple[str, ...] = (),
        engine=None) -> Result:
    """Run one configuration end to end; write evidence into ``outdir`` if given."""
    cfg = validate(cfg)
    res = Result(cfg=cfg, outdir=outdir)
    if outdir:
        os.makedirs(outdir, exist_ok=True)
        write_json(os.path.join(outdir, "config.json"), cfg.to_dict())
    if cfg.mode == "server":
        from workbook import server

        return server.run(cfg, outdir, res, checks=checks, server=engine)  # engine: a Server
    t0 = time.perf_counter()
    sess = Session(cfg, engine=engine).start()
    res.timings.update(sess.engine.timings)
    res.effective = dict(sess.engine.effective)
    res.engine = sess.engine
    _save(res, "effective.json", res.effective)
    try:
        t1 = time.perf_counter()
        res.outcomes = sess.reported()
        res.timings["generate_s"] = time.perf_counter() - t1
        _save(res, "outcome.json", [o.to_dict() for o in res.outcomes])
        for name in checks:
            res.checks[name] = _run_check(sess.engine, name)
            _save(res, "checks.json", res.checks)
        if sess.tracer is not None:
            res.frames = sess.tracer.frames()
            if outdir:
                sess.tracer.save(os.path.join(outdir, "trace"))
        from workbook import diagnose

        res.verdict = diagnose.diagnose(res.frames, res.effective, res.outcomes, cfg)
        _save(res, "verdict.json", res.verdict)
    finally:
        sess.remove_hooks()
        res.timings["total_s"] = time.perf_counter() - t0 + res.timings.get("import_s", 0.0)
        _save(res, "timings.json", res.timings)
    return res


def _run_check(engine, name: str) -> list[dict]:
    from workbook import request

    fn = {"A": request.check_a, "B": request.check_b}[name]
    return [o.to_dict() for o in fn(engine)]


def _save(res: Result, name: str, obj) -> None:
    if res.outdir:
        write_json(os.path.join(res.outdir, name), obj)


def load(outdir: str) -> dict[str, Any]:
    """Everything a run folder holds, for reports (frames as pandas DataFrames if present)."""
    data = {name.split(".")[0]: read_json(os.path.join(outdir, name)) for name in FILES}
    tdir = os.path.join(outdir, "trace")
    frames = {}
    if os.path.isdir(tdir):
        import pandas as pd

        for fname in sorted(os.listdir(tdir)):
            if fname.endswith(".parquet"):
                frames[fname[:-8]] = pd.read_parquet(os.path.join(tdir, fname))
    data["frames"] = frames
    return data
