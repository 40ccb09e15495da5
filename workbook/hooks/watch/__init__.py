"""The start-up watch: who changes ``ThinkingBudgetState``'s device tensors, in which phase.

vLLM #54906: on the reporter's Thor the markers of ``ThinkingBudgetState`` read ``[0]`` after
the initial profiling run, with storage and ``_version`` unchanged — an out-of-band writer that
memory histories and code reading did not find. The watch finds it:

1. **Snapshots at every phase boundary.** Installed *before* the engine starts (``install``:
   in-process before ``vllm.LLM(...)``, under ``vllm serve`` by the plugin at model-runner
   import), it wraps the start-up phase methods of ``workbook.vllm.startup`` (runner
   construction, model and drafter load, state creation, memory profiling, the profiling run's
   target forward / drafter propose / dummy sampler, KV-cache allocation, warm-up, CUDA-graph
   capture) and the step methods. At each boundary (after a method was entered, before it
   returns) the watch compares the bytes of every watched tensor (the marker tensors, their
   caches, the scan positions, the budget's device view, canaries next to the state) with the
   previous boundary and records a change no allowed writer made, with its phase
   (``workbook.hooks.watch.core``).
2. **Localization** (``localize="module"`` / ``"op"``, eager engines only). During start-up and
   the first ``localize_steps`` real steps, global module forward hooks add a boundary before
   and after every module forward (target and drafter modules named ``target.<qualname>`` /
   ``drafter.<qualname>``) and, at level ``op``, a ``TorchDispatchMode`` and a wrapper on
   Triton's launcher add one before and after every aten op / custom op / Triton launch
   (every ``op_stride``-th; inside ``localize_within`` only, if set). Each check synchronizes
   the device, so the first dirty boundary brackets the writer: the innermost frame common to
   the clean and the dirty boundary is the op (the writer), or the module (then the labels say
   between which ops: a write no aten op made), or the phase. Independently of values, an op
   that mutates memory overlapping a watched tensor through another tensor object (an alias)
   and a Triton launch handed a pointer into one are recorded by name. A time limit
   (``localize_timeout_s``) stops the fine levels and records what was narrowed down so far.
3. **Every step afterwards, cheaply.** After the first ``timeline_steps`` real steps (and the
   localized ones) the watch keeps only four boundaries per step (around
   ``apply_staged_writes`` and ``apply``, of every ``ring_stride``-th step), each one
   ``torch.cat`` of the watched tensors into a device ring buffer — no host sync; the ring is
   copied and analysed when full, every ``flush_every_steps`` steps, and when the evidence is
   read.

Nothing the watch does changes what vLLM computes: it reads (copies into its own buffers),
allocates its canaries next to the state, and synchronizes only during start-up and
localization. With ``out_dir`` it writes ``out_dir/watch.json`` as it goes (end of each start-up
phase, first unexpected change, localization stop, ring flushes, exit), so a killed or timed-out
run still leaves what it found.

This module hooks the watch into vLLM: the phase wrappers on the runner, worker, speculator,
sampler and state classes (built once per process, shared by every watch; the runner's
constructor binds the next pending watch, the state's constructor allocates the canaries), the
two ring-mode wrappers that replace them after the detailed steps, ``suspend`` / ``resume``, the
plugin path (options file, ``install_from_dir``, ``read_dir``) and the CPU profiling-run
emulation. It compares and records nothing itself: the ``Watch`` object (boundaries, the
comparison, the ring buffer, the evidence), ``Options``, ``WatchError`` and the registry of this
process's watches are ``workbook.hooks.watch.core``, re-exported here; the localization's hooks
are ``workbook.hooks.watch.localize``.

API: ``install(options) -> Watch`` (before the engine starts; the watch binds to the next
runner built in this process), ``Watch.read()`` (the evidence dict, after a flush),
``Watch.remove()``, ``install_from_dir(watch_dir)`` (the plugin: options from
``watch_dir/options.json``, evidence in ``watch_dir/<pid>/watch.json``), ``force_cpu_profile_run()``,
``suspend()`` / ``resume()``.

The watch's room (this package; how it is hooked into vLLM is here): ``core`` (the Watch
object), ``registry`` (options, errors, this process's watches), ``evidence``, ``localize``
(module / op / Triton-launch boundaries), ``protection`` (the sanitizer stage), ``protect``
(read-only state: NVTX permissions, mprotect), ``redzone``, ``layout`` (caching-allocator
layout evidence), ``apiwrites`` (CUPTI copies and memsets), ``window`` (the profiling run's
dummy sampler as vLLM PR #57926 has it), ``writers`` (test writers for the watch's own tests).
May import: core, vllm, and ``workbook.hooks.faults`` (the test writers are faults).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os

from workbook.core import ranks
from workbook.hooks.watch.localize import frame_ids
from workbook.hooks.watch.core import Boundary, Watch  # noqa: F401  (re-exported)
from workbook.hooks.watch.registry import (  # noqa: F401  (the options' names re-exported)
    ACTIVE, BY_OBJ, CANARY, LOCK, ON_RING, PENDING, SCHEMA, STEP_BOUNDARIES, Options, WatchError,
    canary_i32, current, watch_for)
from workbook.vllm import startup
from workbook.vllm.patching import PatchSet

OPTIONS_FILE = "options.json"

# ---- the class-level patch sets of this process (shared by every watch) --------------------------

_patches: PatchSet | None = None
_late: PatchSet | None = None  # worker classes and the speculator, wrapped at runner build


# ---- the wrappers ----------------------------------------------------------------------------------

def _phase_wrapper(qual: str, find):
    """``make(orig)`` for a phase method: boundaries at entry (after push) and exit."""

    def make(orig):
        @functools.wraps(orig)
        def wrapper(self, *a, **k):
            w = find(self, a)
            if w is None or w.removed:
                return orig(self, *a, **k)
            return _run_in_phase(w, qual, orig, self, a, k)
        wrapper.__watch_qual__ = qual
        return wrapper

    return make


def _run_in_phase(w: Watch, qual: str, orig, self, a, k):
    if qual.endswith(".execute_model") and not w.in_step and startup.is_real_step(
            a[0] if a else k.get("scheduler_output"), k):
        w.step_started()
    w.calls[qual] = w.calls.get(qual, 0) + 1
    w.stack.append((next(frame_ids), qual))
    ACTIVE.append(w)
    depth0 = len(w.stack) == 1
    try:
        w.check("enter", qual)
        if w.protection.guard is not None:  # a refused write ends the process: the evidence names
            w.write()             # the phase (and step) it entered last
        with (w.loc.around() if depth0 or not w.loc.active else contextlib.nullcontext()):
            res = orig(self, *a, **k)
        w.check("exit", qual)
        return res
    finally:
        ACTIVE.pop()
        w.stack.pop()
        if qual == "GPUModelRunner.initialize_kv_cache":
            w.kv_ready = True
        if qual.endswith(".sample_tokens") and w.in_step and \
                not any(q.endswith(".sample_tokens") for _, q in w.stack):
            w.step_finished()
        if depth0 and w.step == 0:
            w.write()


def _find_runner(self, a):
    return BY_OBJ.get(id(self))


def _find_worker(self, a):
    return watch_for(self)


def _find_current(self, a):
    return BY_OBJ.get(id(self)) or current()


def _runner_init(orig):
    @functools.wraps(orig)
    def __init__(self, *a, **k):
        with LOCK:
            w = PENDING.pop(0) if PENDING else None
        if w is None:
            return orig(self, *a, **k)
        w.bind_runner(self)
        res = _run_in_phase(w, "GPUModelRunner.__init__", orig, self, a, k)
        _late_wrap(self)
        spec = getattr(self, "speculator", None)
        if spec is not None:
            BY_OBJ[id(spec)] = w
            w.speculator_class = f"{type(spec).__module__}.{type(spec).__qualname__}"
        return res
    return __init__


def _state_init(orig):
    @functools.wraps(orig)
    def __init__(self, req_states, *a, **k):
        w = current()
        if w is None or w.removed or w.state is not None:
            return orig(self, req_states, *a, **k)
        import torch

        dev = req_states.device
        n = max(64, int(req_states.max_num_reqs))

        def canaries():
            with torch.inference_mode():
                return [torch.full((n,), canary_i32(), dtype=torch.int32, device=dev)
                        for _ in range(w.opts.canaries)]

        pre = canaries()
        w.stack.append((next(frame_ids), "ThinkingBudgetState.__init__"))
        try:
            res = orig(self, req_states, *a, **k)
        finally:
            w.stack.pop()
        post = canaries()
        w.calls["ThinkingBudgetState.__init__"] = 1
        w.attach_state(self, pre, post)
        w.write()
        return res
    return __init__


def _func_wrapper(mod, name: str):
    orig = getattr(mod, name)
    qual = f"{name}()"

    @functools.wraps(orig)
    def wrapper(*a, **k):
        w = watch_for(a[0]) if a else None
        if w is None or w.removed:
            return orig(*a, **k)
        return _run_in_phase(w, qual, lambda _s, *aa, **kk: orig(*aa, **kk), None, a, k)
    return orig, wrapper


_func_patches: list = []


def _late_wrap(runner) -> None:
    """At the first watched runner's construction: worker classes (their modules finished
    importing by now), gpu_worker's warm-up functions, the speculator's class, module names."""
    global _late
    import sys

    if _late is None:
        ps = PatchSet("watch:late", "watch")
        for modname, clsname, methods in startup.WORKER_PHASES:
            mod = sys.modules.get(modname)
            cls = getattr(mod, clsname, None) if mod is not None else None
            if cls is None:
                continue
            for m in methods:
                if m in cls.__dict__:
                    ps.wrap(cls, m, _phase_wrapper(f"{clsname}.{m}", _find_worker))
        for modname, funcs in startup.WORKER_FUNCS:
            mod = sys.modules.get(modname)
            for f in funcs if mod is not None else ():
                if callable(getattr(mod, f, None)):
                    orig, wrapper = _func_wrapper(mod, f)
                    setattr(mod, f, wrapper)
                    _func_patches.append((mod, f, orig, wrapper))
        _late = ps.install()
    spec = getattr(runner, "speculator", None)
    if spec is not None:
        for m in startup.SPECULATOR_METHODS:
            for klass in type(spec).__mro__:
                if m in klass.__dict__:
                    if not getattr(klass.__dict__[m], "__watch_qual__", None):
                        _late.wrap(klass, m, _phase_wrapper(f"{startup.SPECULATOR}.{m}",
                                                            _find_runner))
                    break


def _name_modules(w: Watch, runner) -> None:
    for prefix, root in (("target", getattr(runner, "model", None)),
                         ("drafter", getattr(getattr(runner, "speculator", None), "model", None))):
        if root is None or not hasattr(root, "named_modules"):
            continue
        for n, m in root.named_modules():
            w.modnames.setdefault(id(m), f"{prefix}.{n}" if n else prefix)


def _after_load(orig):
    @functools.wraps(orig)
    def load_model(self, *a, **k):
        res = orig(self, *a, **k)
        w = BY_OBJ.get(id(self))
        if w is not None:
            _name_modules(w, self)
        return res
    return load_model


def _patch_set() -> PatchSet:
    """The class-level wrappers (built once per process; shared by every watch)."""
    global _patches
    if _patches is not None:
        return _patches
    import importlib

    ps = PatchSet("watch", "watch")
    runner_cls = None
    for modname, clsname, methods in startup.RUNNER_PHASES:
        try:
            cls = getattr(importlib.import_module(modname), clsname)
        except Exception:  # e.g. the CPU runner on a GPU build
            continue
        if clsname == "GPUModelRunner":
            runner_cls = cls
        finder = _find_current if clsname in ("Sampler", "ThinkingBudgetState") else _find_runner
        for m in methods:
            if m not in cls.__dict__:
                continue
            if (clsname, m) == ("GPUModelRunner", "__init__"):
                ps.wrap(cls, m, _runner_init)
            else:
                ps.wrap(cls, m, _phase_wrapper(f"{clsname}.{m}", finder))
    if runner_cls is None:
        raise WatchError("vLLM's MRV2 runner (vllm.v1.worker.gpu.model_runner.GPUModelRunner) "
                         "is missing: the watch needs Model Runner V2")
    from vllm.v1.worker.gpu.sample import thinking_budget as tbm

    ps.wrap(tbm.ThinkingBudgetState, "__init__", _state_init)
    ps.wrap(runner_cls, "load_model", _after_load)
    _patches = ps
    return ps


def install(opts: Options | None = None, **kw) -> Watch:
    """Install the watch for the next engine this process starts (before ``vllm.LLM``)."""
    import vllm

    opts = opts or Options(**kw)
    from vllm.v1.worker.gpu.sample import thinking_budget as tbm

    startup.check_state_class(tbm.ThinkingBudgetState, vllm.__version__)
    ps = _patch_set()
    _full_in()  # a start-up to watch: every phase wrapper (also after a slim phase)
    ps.install()
    w = Watch(opts)
    w.version = vllm.__version__
    import torch

    w.protection.plan("cuda" if torch.cuda.is_available() else "cpu")
    with LOCK:
        PENDING.append(w)
    atexit.register(w.write)
    return w


_ring_patches: PatchSet | None = None  # after start-up: only the budget state's writers


def _ring_wrapper(qual: str, enter_step: bool):
    def make(orig):
        @functools.wraps(orig)
        def wrapper(self, *a, **k):
            w = BY_OBJ.get(id(self))
            if w is None or w.removed or w.mode != "ring":
                return orig(self, *a, **k)
            if enter_step:
                w.step += 1
                if w.protection.guard is not None:  # sanitizer stage: the step a write is in
                    w.write()
            if w.step % w.opts.ring_stride:  # a step not checked: the next check rebases
                w.rebase = True
                return orig(self, *a, **k)
            frame = (next(frame_ids), qual)
            w.stack.append(frame)
            try:
                w.check("enter", qual)
                res = orig(self, *a, **k)
                w.check("exit", qual)
            finally:
                w.stack.pop()
            if not enter_step and w.opts.flush_every_steps and \
                    w.step % w.opts.flush_every_steps == 0:
                w.flush()
                w.write()
            return res
        return wrapper
    return make


def _slim() -> None:
    """Once every watch of the process is past its detailed steps: swap the full set of
    wrappers for two (``apply_staged_writes`` — which also counts the steps — and ``apply``),
    so a step pays for four ring records and two Python wrappers, nothing else."""
    global _ring_patches
    ws = watches()
    if PENDING or not ws or any(w.mode != "ring" for w in ws if not w.removed):
        return
    if _ring_patches is None:
        from vllm.v1.worker.gpu.sample import thinking_budget as tbm

        ps = PatchSet("watch:ring", "watch")
        ps.wrap(tbm.ThinkingBudgetState, "apply_staged_writes",
                _ring_wrapper("ThinkingBudgetState.apply_staged_writes", True))
        ps.wrap(tbm.ThinkingBudgetState, "apply", _ring_wrapper("ThinkingBudgetState.apply",
                                                                 False))
        _ring_patches = ps
    _full_out()
    _ring_patches.install()


def _full_out() -> None:
    if _late is not None:
        _late.remove()
    if _patches is not None:
        _patches.remove()
    for mod, f, orig, _wrapper in _func_patches:
        setattr(mod, f, orig)


def _full_in() -> None:
    if _ring_patches is not None:
        _ring_patches.remove()
    if _patches is not None:
        _patches.install()
    if _late is not None:
        _late.install()
    for mod, f, _orig, wrapper in _func_patches:
        setattr(mod, f, wrapper)


def suspend() -> None:
    """Take every watch wrapper out (the watches keep their evidence; benchmarks compare
    watched and unwatched steps of one engine). ``resume()`` puts them back."""
    global _suspended
    for w in watches():
        with LOCK:
            w.flush()
            w.rebase = True
    _suspended = "ring" if _ring_patches is not None and _ring_patches.installed else "full"
    _full_out()
    if _ring_patches is not None:
        _ring_patches.remove()


_suspended: str | None = None


def resume() -> None:
    if _suspended == "ring":
        _ring_patches.install()
    elif _suspended == "full":
        _full_in()


def watches() -> list[Watch]:
    return list({id(w): w for w in BY_OBJ.values()}.values())


# ---- the plugin path -------------------------------------------------------------------------------

def write_options(watch_dir: str, opts: dict) -> str:
    os.makedirs(watch_dir, exist_ok=True)
    path = os.path.join(watch_dir, OPTIONS_FILE)
    with open(path, "w") as f:
        json.dump(opts, f, indent=1)
    return path


def install_from_dir(watch_dir: str) -> Watch:
    """Inside a vLLM process (the plugin): options from ``watch_dir/options.json``, evidence
    into ``watch_dir/<pid>/watch.json``."""
    path = os.path.join(watch_dir, OPTIONS_FILE)
    raw = {}
    if os.path.exists(path):
        with open(path) as f:
            raw = json.load(f)
    opts = Options.from_dict(raw)
    opts.out_dir = os.path.join(watch_dir, str(os.getpid()))
    if not opts.flush_every_steps:
        opts.flush_every_steps = 1  # the server's engine process is killed at shutdown
    return install(opts)


def read_dir(watch_dir: str) -> dict | None:
    """The evidence a served engine wrote, read by ``core.ranks.read_per_rank`` (the one
    per-rank reader: every process's ``<pid>/watch.json``, the reference sampling rank first):
    the first reading whose watch found the budget state, else the first; with several ranks,
    in the in-process backend's shape (``rank`` its label, ``ranks`` every rank's reading)."""
    per = ranks.read_per_rank(watch_dir, "watch.json")
    if not per:
        return None
    lead = next((k for k, d in per.items() if isinstance(d, dict) and d.get("state_found")),
                next(iter(per)))
    return {**per[lead], "rank": lead, "ranks": per} if len(per) > 1 else per[lead]


# ---- CPU platform: the profiling run the GPU worker always does ------------------------------------

_cpu_profile: PatchSet | None = None


def force_cpu_profile_run() -> PatchSet | None:
    """vLLM 0.30+ on CPU skips ``profile_run`` with eager mode and an explicit KV-cache size;
    the GPU worker always runs it. This makes ``CPUWorker._should_warm_up_model()`` answer
    True (a platform emulation recorded in the evidence; vLLM 0.29's CPU worker always runs
    it). None where the method does not exist."""
    global _cpu_profile
    if _cpu_profile is not None:
        return _cpu_profile.install()
    try:
        from vllm.v1.worker.cpu_worker import CPUWorker
    except Exception:
        return None
    if "_should_warm_up_model" not in CPUWorker.__dict__:
        return None
    ps = PatchSet("cpu-profile-run", "fault")
    ps.wrap(CPUWorker, "_should_warm_up_model", lambda orig: (lambda self: True))
    _cpu_profile = ps
    return ps.install()


ON_RING.append(_slim)  # the Watch calls it when it enters ring mode (watch_registry)
