"""Keep async scheduling on for vLLM on the CPU platform (opt-in: ``RunConfig.async_on_cpu``).

vLLM's ``CpuPlatform.check_and_update_config`` sets ``scheduler_config.async_scheduling =
False`` ("async scheduling is not required on CPU"), after ``VllmConfig`` validated the setting
(its spec-method and executor checks ran on what the user asked for). On the GPU async
scheduling is MRV2's default, so a defect that lives only there (the scheduler running one step
ahead of the model runner, drafts of step s+1 scheduled before step s's acceptance is known)
would never show on CPU. In the spirit of ``workbook.vllm.cpu_shim`` (Triton kernels in the
interpreter), this shim wraps that one classmethod: when the user asked for
``async_scheduling=True`` explicitly, the value is put back after the platform's update;
``None`` / ``False`` are left as the platform leaves them. ``installed()`` says whether it is on;
``remove()`` puts vLLM's own classmethod back (the identical object).

Whether the engine really ran with async scheduling is read from the live engine, not assumed:
``effective(llm)`` (the engine core's ``batch_queue`` exists only with async scheduling).
"""

from __future__ import annotations

_saved = None  # the classmethod object from CpuPlatform.__dict__ while installed


def install() -> bool:
    """Wrap ``CpuPlatform.check_and_update_config`` (idempotent); False when vLLM has no CPU
    platform class."""
    global _saved
    if _saved is not None:
        return True
    try:
        from vllm.platforms.cpu import CpuPlatform
    except Exception:
        return False
    original = CpuPlatform.__dict__.get("check_and_update_config")
    if original is None:
        return False
    func = original.__func__ if isinstance(original, classmethod) else original

    def check_and_update_config(cls, vllm_config):
        sched = getattr(vllm_config, "scheduler_config", None)
        wanted = getattr(sched, "async_scheduling", None)
        func(cls, vllm_config)
        if wanted is True and sched is not None and not sched.async_scheduling:
            sched.async_scheduling = True

    check_and_update_config.__wrapped__ = func  # type: ignore[attr-defined]
    CpuPlatform.check_and_update_config = classmethod(check_and_update_config)
    _saved = original
    return True


def installed() -> bool:
    return _saved is not None


def remove() -> None:
    global _saved
    if _saved is None:
        return
    from vllm.platforms.cpu import CpuPlatform

    CpuPlatform.check_and_update_config = _saved
    _saved = None


def effective(llm) -> bool | None:
    """Whether the in-process engine ``llm`` schedules asynchronously: its engine core's batch
    queue (vLLM creates it only when ``max_concurrent_batches > 1``, i.e. async scheduling);
    None when the engine core cannot be reached."""
    core = getattr(getattr(getattr(llm, "llm_engine", None), "engine_core", None),
                   "engine_core", None)
    if core is None:
        return None
    return getattr(core, "batch_queue", None) is not None
