"""workbook: find out why vLLM ignores ``thinking_token_budget`` with MRV2 + MTP (vLLM #54906).

Import-light on purpose: vLLM's worker processes import ``workbook.hooks.plugin`` through the
``vllm.general_plugins`` entry point, and the CPU shim runs at interpreter start-up.
Heavy modules (vllm, torch, pandas) are imported by the submodules that need them.
"""

__version__ = "0.1.0"
