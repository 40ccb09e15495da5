"""Everything that touches vLLM: the process environment (``env``), the CPU shim
(``cpu_shim``), the effective configuration (``effective``), the MRV2 hook points
(``hookpoints``), removable patches (``patching``) and the in-process engine (``engine``).

Import-light: vLLM and torch are imported inside the functions that need them (the CPU shim
is loaded at interpreter start-up through a ``.pth`` file)."""
