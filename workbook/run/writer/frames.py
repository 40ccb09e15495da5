"""The writer named from a Python stack: which frame launched the write, and in which module.

A write to a watched tensor reaches the workbook as a Python stack (innermost first): memcheck's
host frames (``workbook.run.writer.sanitizer.parse``), the page twin's fault dump
(``sanitizer.parse_fault``) or a CUPTI record of a copy or memset (``workbook.hooks.watch.apiwrites``).
The writer is the innermost frame whose module is not machinery — Triton's, PyTorch's, vLLM's
launch plumbing, the workbook's own hooks (``MACHINERY_MODULES``). A frame's module comes from
its path when it has a folder; memcheck prints base names only, so then from the child's module
table (``modules.json``: base name -> [[module, path]], candidates told apart by the function
defined at that line), else from the library frames below (each read in that library's source),
else it is unknown (the file's stem) and counts as the writer's. ``name_writer`` also gives the
forward the write ran in and the start-up phase the stack lies in (``startup.phase_from_frames``).

Deliberately not here: reading any log format (``workbook.run.writer.sanitizer``), the step number and
phase from the watch's own record (``sanitizer.phase_from_watch``), judging what was written.
"""

from __future__ import annotations

import linecache

from workbook.vllm import startup

MACHINERY_MODULES = ("triton", "torch", "ctypes", "contextlib", "functools", "threading",
                     "vllm.compilation", "vllm.model_executor.custom_op", "vllm.triton_utils",
                     "vllm.forward_context", "vllm.v1.worker.gpu.eplb_utils",
                     "workbook.hooks.watch", "workbook.hooks.watch.core",
                     "workbook.hooks.watch.protect", "workbook.hooks.watch.localize",
                     "workbook.vllm.patching")
_LIBRARY_FRAMES = {  # (base name, function) -> module
    ("driver.py", "__call__"): "triton.backends.nvidia.driver",
    ("driver.py", "launch"): "triton.backends.nvidia.driver",
    ("jit.py", "run"): "triton.runtime.jit", ("jit.py", "<lambda>"): "triton.runtime.jit",
    ("jit.py", "__call__"): "triton.runtime.jit",
    ("autotuner.py", "run"): "triton.runtime.autotuner",
    ("autotuner.py", "_bench"): "triton.runtime.autotuner",
    ("autotuner.py", "kernel_call"): "triton.runtime.autotuner",
    ("autotuner.py", "benchmark"): "triton.runtime.autotuner",
    ("_contextlib.py", "decorate_context"): "torch.utils._contextlib",
    ("module.py", "_call_impl"): "torch.nn.modules.module",
    ("module.py", "_wrapped_call_impl"): "torch.nn.modules.module",
    ("_ops.py", "__call__"): "torch._ops", ("_compile.py", "inner"): "torch._compile",
    ("eval_frame.py", "_fn"): "torch._dynamo.eval_frame",
    ("decorators.py", "__call__"): "vllm.compilation.decorators",
    ("cuda_graph.py", "__call__"): "vllm.compilation.cuda_graph",
    ("custom_op.py", "forward"): "vllm.model_executor.custom_op",
    ("eplb_utils.py", "wrapper"): "vllm.v1.worker.gpu.eplb_utils",
    ("watch.py", "_run_in_phase"): "workbook.hooks.watch",
    ("watch.py", "wrapper"): "workbook.hooks.watch",
    ("patching.py", "wrapper"): "workbook.vllm.patching",
}


# inside a machinery package, the modules that write on purpose: the watch's test writers
# (hooks/watch/writers.py since the house move) are writers to name, not launch plumbing
WRITER_MODULES = ("workbook.hooks.watch.writers",)


def is_machinery(module: str | None) -> bool:
    m = module or ""
    if any(m == w or m.startswith(w + ".") for w in WRITER_MODULES):
        return False
    return m.startswith("<frozen") or any(m == p or m.startswith(p + ".")
                                          for p in MACHINERY_MODULES)


def _defines(path: str, func: str, line: int) -> bool:
    """Does ``path`` hold ``def func`` at or above ``line`` (a module's own frame)?"""
    if func in ("<module>", "<lambda>", "<listcomp>", "<genexpr>", "<dictcomp>"):
        return bool(linecache.getline(path, line))
    want = (f"def {func}(", f"def {func} (")
    return any(linecache.getline(path, i).lstrip().removeprefix("async ").startswith(want)
               for i in range(line, 0, -1))


def frame_module(frame: dict, modules: dict | None = None) -> dict:
    """``{"module", "how", "machinery"}`` for one Python frame: by its path when it has a
    folder; else by the child's module table (``modules``: base name -> [[module, path]]),
    candidates sharing the base name told apart by the function at that line; else by the
    library frames memcheck prints; else unknown (the stem; not machinery)."""
    f, func, line = frame["file"], frame["func"], frame.get("line") or 0
    if "/" in f.replace("\\", "/"):
        mod = python_module(f)
        return {"module": mod, "how": "path", "machinery": is_machinery(mod)}
    cands = (modules or {}).get(f) or []
    if len(cands) > 1:
        own = [c for c in cands if _defines(c[1], func, line)]
        cands = own or cands
    if len(cands) == 1:
        mod = cands[0][0]
        return {"module": mod, "how": "module table", "machinery": is_machinery(mod)}
    if cands:
        names = sorted(c[0] for c in cands)
        return {"module": " or ".join(names), "how": "module table (ambiguous)",
                "machinery": all(is_machinery(n) for n in names)}
    lib = _LIBRARY_FRAMES.get((f, func))
    if lib is not None:
        return {"module": lib, "how": "library frame", "machinery": True}
    stem = f[:-3] if f.endswith(".py") else f
    return {"module": stem, "how": "unknown (file name only)", "machinery": is_machinery(stem)}


def python_module(path: str) -> str:
    """``/…/site-packages/vllm/v1/x.py`` → ``vllm.v1.x``; ``/repo/workbook/hooks/f.py`` →
    ``workbook.hooks.f``; anything else: the file name without ``.py``."""
    p = path.replace("\\", "/")
    for anchor in ("/site-packages/", "/dist-packages/"):
        if anchor in p:
            p = p.split(anchor, 1)[1]
            break
    else:
        for top in ("/workbook/", "/vllm/", "/benchmarks/", "/tests/", "/scripts/"):
            if top in p:
                p = top[1:] + p.rsplit(top, 1)[1]
                break
        else:
            p = p.rsplit("/", 1)[-1]
    return p[:-3].replace("/", ".") if p.endswith(".py") else p


def name_writer(frames: list[dict], modules: dict | None = None) -> dict | None:
    """The writer among Python frames (innermost first): the innermost frame whose module is
    not machinery (Triton, PyTorch, vLLM's launch plumbing, the workbook's hooks:
    ``frame_module``), its module, the forward it runs in, and the phase the stack lies in
    (``startup.phase_from_frames``; a step's number is the watch's, ``phase_from_watch``)."""
    if not frames:
        return None
    judged = [(f, frame_module(f, modules)) for f in frames]
    pick, pm = next(((f, m) for f, m in judged if not m["machinery"]), judged[0])
    fwd = next(((f, m) for f, m in judged if f["func"] == "forward" and not m["machinery"]),
               None)
    skipped = [f"{f['func']} in {f['file']}:{f['line']} ({m['module']})"
               for f, m in judged[:judged.index((pick, pm))]]
    return {"frame": f"{pick['func']} in {pick['file']}:{pick['line']}",
            "function": pick["func"], "file": pick["file"], "line": pick["line"],
            "module": pm["module"], "module_how": pm["how"],
            "skipped_frames": skipped[:12],
            "in_forward_of": fwd[1]["module"] if fwd else None,
            "phase": startup.phase_from_frames(
                [(f["file"], f["func"]) for f in reversed(frames)]),
            "stack": [f"{f['func']} in {f['file']}:{f['line']}" for f in frames[:30]]}
