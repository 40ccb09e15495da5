"""The run executors by name (an environment's ``executor``; ``workbook run --executor``).

``papermill`` (a papermill process per run, ``workbook.batch.executors``), ``papermill-warm``
(every run by papermill on one warm kernel, engines shared: ``workbook.batch.warmkernel``) and
``in-process`` (the pipeline in this process). An executor with a ``close()`` is closed once the
batch's runs are done. Deliberately only the table: how a run executes lives in its module.
"""

from __future__ import annotations

from workbook.batch import executors, warmkernel


def _warm(*args, **kw):
    return warmkernel.run_papermill_warm(*args, **kw)


_warm.close = warmkernel.close  # the batch calls an executor's close() once its runs are done

EXECUTORS = {"papermill": executors.run_papermill, "papermill-warm": _warm,
             "in-process": executors.run_in_process}
