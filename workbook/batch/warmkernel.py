"""The ``papermill-warm`` executor: every run of a batch executed by papermill on one warm kernel.

``run_papermill`` starts, per run, a papermill process, a kernel, vLLM's import and an engine;
on 2 CPU cores that is about two thirds of a tiny run's time. Here the batch's process runs
papermill itself (papermill's engine registry: the ``workbook-warm`` engine, an nbclient engine
on a kernel this module keeps), on one kernel per batch: vLLM is imported once, and the
pipeline's engines (``workbook.vllm.engine.shared``, ``workbook.run.backends.own_engine``) are
shared by the runs with the same engine configuration, as in the ``in-process`` executor; each
run's hooks are removed when it ends (removing a hook restores vLLM exactly).

What a run keeps is ``run_papermill``'s: its own folder with ``parameters.yaml``, the executed
notebook (written after every cell, so a failing run keeps its partial notebook),
``papermill.log`` (papermill's log and, on failure, the exception it raised), the pipeline's
evidence and ``vllm.log`` (a reused engine's start-up log, ``InProcess.save_files``), and its
manifest row (``executors.manifest_row``), and ``kernel.log`` (what the kernel's process itself wrote
during the run: vLLM's own log lines; papermill's process wrote them into ``papermill.log``).
Before each run the kernel's namespace is emptied (``%reset -f``), its working directory is the
run's folder and its stdout / stderr go to the run's ``kernel.log``. The run's time limit: the
cell timeout, then the kernel's process tree (kernel, engines) killed at the limit plus the
grace; a run that fails or is stopped leaves a kernel nobody reuses: it is killed with its
processes and the next run starts a fresh one. ``close()`` (the batch's end, signals included)
kills the last kernel's tree: no process outlives the batch.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
import traceback
from typing import Any


from workbook.batch import executors as ex
from workbook.batch.environment import RunSpec
from workbook.batch.signals import Interrupted
from workbook.core.rundir import now

ENGINE = "workbook-warm"  # the papermill engine's name in papermill's registry
KERNEL_LOG = "kernel.log"  # in each run's folder: what the kernel's process wrote (vLLM's log)
JOIN_S = 60.0
# nbclient waits 4 s (its default) for a cell's last IOPub output after the cell's reply; on a
# loaded 2-core machine a cell with a large display missed that and its run was failed, though
# the cell had finished. The cell's own timeout is the run's timeout, as before.
IOPUB_TIMEOUT_S = 120  # how long a killed run's papermill thread may take to write its notebook


@dataclasses.dataclass
class _Kernel:
    km: Any  # jupyter_client.KernelManager
    name: str
    tag: str  # WORKBOOK_RUN_TAG of its processes (executors.kill_tree)

    @property
    def pid(self) -> int | None:
        proc = getattr(getattr(self.km, "provisioner", None), "process", None)
        return getattr(proc, "pid", None)


_KERNEL: _Kernel | None = None


def _start_kernel(name: str, cwd: str, env: dict[str, str]) -> _Kernel:
    # nbclient's own kind of manager (asynchronous): a blocking client would block nbclient's
    # event loop on its IOPub wait, and no cell timeout would ever fire
    from jupyter_client.manager import AsyncKernelManager
    from jupyter_core.utils import run_sync

    tag = f"{os.path.abspath(cwd)}:warm:{os.getpid()}"
    km = AsyncKernelManager(kernel_name=name)
    with open(os.path.join(cwd, KERNEL_LOG), "ab") as out:  # until the first run's prelude
        try:
            run_sync(km.start_kernel)(cwd=cwd, env={**env, ex.MARKER: tag}, stdout=out,
                                      stderr=out)
        except BaseException:
            ex.kill_tree(None, marker=tag)  # whatever it started
            raise
    return _Kernel(km, name, tag)


def _alive(k: _Kernel) -> bool:
    import psutil

    try:
        return k.pid is not None and psutil.Process(k.pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def close() -> None:
    """Kill the warm kernel with every process of its tree (engines included)."""
    global _KERNEL
    k, _KERNEL = _KERNEL, None
    if k is None:
        return
    try:
        ex.kill_tree(k.pid, marker=k.tag)  # pid None: the tagged processes only
    finally:
        try:
            from jupyter_core.utils import run_sync

            run_sync(k.km.cleanup_resources)()  # its connection file
        except Exception:
            pass


def _engine_class():
    from papermill.clientwrap import PapermillNotebookClient
    from papermill.engines import NBClientEngine
    from papermill.utils import merge_kwargs, remove_args

    class WarmClient(PapermillNotebookClient):
        """papermill's client on a kernel it does not own: before the cells, the kernel's
        namespace is emptied and its working directory set to the run's folder; after them
        the client's channels are closed (the kernel lives on)."""

        prelude = ""

        def papermill_execute_cells(self):
            msg_id = self.kc.execute(self.prelude, silent=True, store_history=False)
            reply = self.wait_for_reply(msg_id)
            if (reply or {}).get("content", {}).get("status") != "ok":
                raise RuntimeError(f"the warm kernel refused the run's set-up: "
                                   f"{(reply or {}).get('content')}")
            super().papermill_execute_cells()

    class WarmEngine(NBClientEngine):
        @classmethod
        def execute_managed_notebook(cls, nb_man, kernel_name, log_output=False,
                                     stdout_file=None, stderr_file=None, start_timeout=60,
                                     execution_timeout=None, **kwargs):
            km, cwd = kwargs.pop("km"), kwargs.pop("run_cwd")
            kwargs = remove_args(["input_path", "timeout", "startup_timeout"], **kwargs)
            client = WarmClient(nb_man, km=km, **merge_kwargs(
                kwargs, timeout=execution_timeout, iopub_timeout=IOPUB_TIMEOUT_S, startup_timeout=start_timeout,
                kernel_name=kernel_name, log=logging.getLogger("papermill"),
                log_output=log_output, stdout_file=stdout_file, stderr_file=stderr_file))
            log = os.path.join(cwd, KERNEL_LOG)
            client.prelude = (
                "get_ipython().run_line_magic('reset', '-f')\n"
                f"import os as _os\n_os.chdir({cwd!r})\n"
                f"_fd = _os.open({log!r}, _os.O_WRONLY | _os.O_CREAT | _os.O_APPEND, 0o644)\n"
                "_os.dup2(_fd, 1); _os.dup2(_fd, 2); _os.close(_fd)\ndel _os, _fd")
            try:
                return client.execute()
            finally:
                if client.kc is not None:
                    client.kc.stop_channels()

    return WarmEngine


def _register() -> None:
    from papermill.engines import papermill_engines

    if ENGINE not in papermill_engines._engines:
        papermill_engines.register(ENGINE, _engine_class())


def run_papermill_warm(spec: RunSpec, run_dir: str, *, extra_env: dict[str, str],
                       kernel: str | None, timeout: float | None = None, on_progress=None,
                       guard=None) -> dict[str, Any]:
    """``executors.run_papermill``'s contract (folder, files, manifest row) on the warm
    kernel."""
    global _KERNEL
    import papermill

    _register()
    folder, params, src, spec = ex.prepare_run(spec, run_dir, timeout)
    limit = spec.timeout
    name = kernel or ex.fallback_kernel(src) or _notebook_kernel(src)
    t0 = time.perf_counter()
    started = now()
    if _KERNEL is not None and (_KERNEL.name != name or not _alive(_KERNEL)):
        close()
    if _KERNEL is None:
        try:
            _KERNEL = _start_kernel(name, folder, {**os.environ, **extra_env,
                                                   "PYTHONUNBUFFERED": "1"})
        except Exception:  # a failure row, as a papermill process that could not start one
            with open(os.path.join(folder, "papermill.log"), "w") as f:
                f.write(f"the warm kernel {name!r} did not start\n{traceback.format_exc()}")
            close()
            return ex.manifest_row(spec, folder, 1, False, time.perf_counter() - t0, started)
    k = _KERNEL
    box: dict[str, Any] = {}
    log = open(os.path.join(folder, "papermill.log"), "w")
    handler = logging.StreamHandler(log)
    handler.setFormatter(logging.Formatter("%(asctime)s - %(name)s - %(levelname)s - %(message)s"))
    pm_log = logging.getLogger("papermill")
    pm_log.addHandler(handler)
    level = pm_log.level
    pm_log.setLevel(logging.INFO)

    lock = threading.Lock()

    def release():
        """papermill's log handler off, the log closed: once, by whoever is last (the batch,
        or a papermill thread that outlived its run: a killed kernel's DeadKernelError)."""
        with lock:
            if log.closed:
                return
            pm_log.removeHandler(handler)
            pm_log.setLevel(level)
            log.close()

    def work():
        try:
            papermill.execute_notebook(
                src, ex.executed_path(spec, folder), parameters=params, engine_name=ENGINE,
                kernel_name=name, progress_bar=False, execution_timeout=int(limit),
                km=k.km, run_cwd=folder)
        except BaseException as e:  # recorded in papermill.log, as papermill's CLI would
            box["error"] = e
            with lock:
                if not log.closed:
                    log.write(traceback.format_exc())
                    log.flush()
        finally:  # never a traceback on the terminal from this thread
            with lock:
                box["done"] = True
                mine = box.get("detached", False)
            ended.set()
            if mine:
                release()

    # the thread's end as an Event: Thread.join interrupted by a signal (Ctrl-C) can leave
    # is_alive() False while the thread still runs (CPython's join), then the log was closed
    # under a papermill thread still writing into it
    ended = threading.Event()

    thread = threading.Thread(target=work, name=f"papermill-{spec.name}", daemon=True)
    if guard is not None and k.pid is not None:
        guard.child = (k.pid, k.tag)
    killed = False
    try:
        thread.start()
        deadline = time.monotonic() + limit + ex.KILL_GRACE_S
        while not ended.is_set():
            ended.wait(ex.POLL_S)
            if on_progress is not None and not ended.is_set():
                on_progress(*ex.progress_text(spec.name, folder, time.perf_counter() - t0))
            if not ended.is_set() and time.monotonic() >= deadline:
                killed = True
                close()
                ended.wait(JOIN_S)
                break
    except Interrupted as e:
        close()
        ended.wait(JOIN_S)
        e.row = ex.manifest_row(spec, folder, 1, False, time.perf_counter() - t0, started,
                        interrupted=e)
        raise
    finally:
        if guard is not None:
            guard.child = None
        with lock:  # a thread still running releases the log itself when it ends
            box["detached"] = not box.get("done")
        if not box["detached"]:
            release()
    rc = 0 if "error" not in box and not killed else 1
    if rc:
        close()  # a failed run's kernel may hold a half-done cell or a broken engine
    return ex.manifest_row(spec, folder, rc, killed, time.perf_counter() - t0, started)


def _notebook_kernel(ipynb: str) -> str:
    import nbformat

    return nbformat.read(ipynb, as_version=4).metadata.get("kernelspec", {}).get(
        "name") or "python3"


run_papermill_warm.close = close  # the batch calls it once its runs are done
