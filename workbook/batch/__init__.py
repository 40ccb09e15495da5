"""Batches: an environment's parameter matrix run into ``outputs/<hardware>/<run-id>/``.

``environment`` (load and validate the YAML), ``executors`` (papermill or in-process, one run),
``execute`` (the batch, its manifest and checksums), ``envcapture`` (``environment.json``).
"""

from workbook.batch.environment import (Environment, RunSpec, load_environment,  # noqa: F401
                                        notebook_parameters, read_notebook, select)
from workbook.batch.execute import execute  # noqa: F401
from workbook.core.rundir import latest_runs, verify  # noqa: F401
