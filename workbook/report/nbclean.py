"""What a saved workbook notebook keeps: its source, never its outputs (JupyterLab's save hook).

The notebooks under ``notebooks/`` are tracked as a jupytext pair (``NN_name.py``, the source,
and ``NN_name.ipynb`` without outputs, which papermill runs). JupyterLab writes outputs,
execution counts, the kernel's ``language_info`` and widget state into the ``.ipynb`` on every
save (and autosave); the repository would then be dirty a minute after a notebook is opened.

``strip(nb)`` reduces a notebook to what the tracked ``.ipynb`` holds: code cells without
outputs and execution counts, cell metadata reduced to the pair's ``cell_metadata_filter``
(``tags``) and jupytext's own round-trip keys, notebook metadata reduced to ``jupytext`` (without its ``text_representation``)
and ``kernelspec``. ``pre_save_hook`` applies it to every notebook a Jupyter server saves
that is paired with a ``py:percent`` file and runs on the ``workbook`` kernel (the workbook's
notebooks; other notebooks are left as they are). ``setup.sh`` installs it into the venv's Jupyter server configuration
(``<venv>/etc/jupyter/jupyter_server_config.json``: ``ContentsManager.pre_save_hook``, merged
into what the file already holds; nothing in ``~/.jupyter``). Outputs stay in the open browser tab; executed copies with outputs
are what ``workbook run`` writes under ``outputs/``.

Deliberately not here: anything that runs a notebook (papermill, ``workbook.batch``). This
module imports nothing but the standard library, so the server loads it in milliseconds.
"""

from __future__ import annotations

from typing import Any

# tags (the pair's cell_metadata_filter) and jupytext's own round-trip keys (its
# cell_metadata._JUPYTEXT_CELL_METADATA): what `jupytext --sync` writes into the .ipynb
KEEP_CELL_METADATA = ("tags", "skipline", "noskipline", "cell_marker", "lines_to_next_cell",
                      "lines_to_end_of_cell_marker")
KEEP_NOTEBOOK_METADATA = ("jupytext", "kernelspec")
CONFIG_FILE = "jupyter_server_config.json"  # in <venv>/etc/jupyter/ (conf.d holds extensions only)
SERVER_CONFIG = {"ContentsManager": {"pre_save_hook": "workbook.report.nbclean.pre_save_hook"}}


def is_workbook_notebook(nb: dict) -> bool:
    """A workbook notebook: paired with a jupytext percent script and on the ``workbook``
    kernel (any other notebook a server of this venv saves is left as it is)."""
    meta = nb.get("metadata") or {}
    formats = str((meta.get("jupytext") or {}).get("formats") or "")
    kernel = (meta.get("kernelspec") or {}).get("name")
    return "ipynb" in formats and "py:percent" in formats and kernel == "workbook"


def strip(nb: dict) -> dict:
    """``nb`` (an nbformat dict, changed in place and returned) as the tracked file holds it."""
    for cell in nb.get("cells") or []:
        if cell.get("cell_type") == "code":
            cell["outputs"] = []
            cell["execution_count"] = None
        meta = cell.get("metadata") or {}
        cell["metadata"] = {k: meta[k] for k in KEEP_CELL_METADATA if k in meta}
        if "attachments" in cell and not cell["attachments"]:
            del cell["attachments"]
    meta = nb.get("metadata") or {}
    kept = {k: meta[k] for k in KEEP_NOTEBOOK_METADATA if k in meta}
    if isinstance(kept.get("jupytext"), dict):
        kept["jupytext"] = {k: v for k, v in kept["jupytext"].items()
                            if k != "text_representation"}
    nb["metadata"] = kept
    return nb


def pre_save_hook(model: dict[str, Any], path: str = "", contents_manager=None,
                  **kwargs) -> None:
    """``ContentsManager.pre_save_hook``: strip a workbook notebook before it is written."""
    if model.get("type") != "notebook" or not isinstance(model.get("content"), dict):
        return
    if is_workbook_notebook(model["content"]):
        strip(model["content"])


def server_config_path(prefix: str | None = None) -> str:
    """Where ``setup.sh`` installs the hook: the venv's Jupyter server configuration."""
    import os
    import sys

    return os.path.join(prefix or sys.prefix, "etc", "jupyter", CONFIG_FILE)


def install_server_config(prefix: str | None = None) -> str:
    """Merge ``SERVER_CONFIG`` into this venv's Jupyter server configuration; return its
    path (idempotent; other settings in the file are kept)."""
    import json
    import os

    path = server_config_path(prefix)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    config = {}
    if os.path.exists(path):
        with open(path) as f:
            config = json.load(f)
    for section, values in SERVER_CONFIG.items():
        config.setdefault(section, {}).update(values)
    with open(path + ".tmp", "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    os.replace(path + ".tmp", path)
    return path


def main(argv: list[str] | None = None) -> int:
    """``python -m workbook.report.nbclean NOTEBOOK.ipynb ...``: strip them in place (what a
    save in JupyterLab does); ``--install-server-config``: install the save hook (setup.sh)."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m workbook.report.nbclean",
                                description=main.__doc__.split(";")[0])
    p.add_argument("notebooks", nargs="*")
    p.add_argument("--install-server-config", action="store_true")
    args = p.parse_args(argv)
    if args.install_server_config:
        print(install_server_config())
    import nbformat

    for path in args.notebooks:
        nb = nbformat.read(path, as_version=4)
        text = nbformat.writes(strip(nb)) + "\n"
        with open(path, encoding="utf-8") as f:
            if f.read() == text:
                continue
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        print(f"stripped {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
