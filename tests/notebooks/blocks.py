# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# Test notebook: a run that writes its config.json through the pipeline, then blocks until it
# is killed (deterministic cell timeouts for tests/test_batch.py, whatever the machine's speed).

# %% tags=["parameters"]
model: str = "tiny-mimo-mtp"  # tiny model name
spec_method: str = "mtp"  # speculative method
max_tokens: int = 8  # completion length
outdir: str = ""  # evidence folder

# %%
import time

from workbook.core.config import RunConfig
from workbook.run import pipeline

# %%
run = pipeline.Run(RunConfig.from_params(globals()), outdir or None)  # writes config.json

# %%
time.sleep(10 ** 6)  # blocks until the cell timeout / the kill
