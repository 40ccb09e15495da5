"""Writes through the CUDA API named at the call (issue 27): the CUPTI watcher's records
(``workbook.hooks.watch.apiwrites``) judged into the writer the watch names (``sanitizer.api_writer``)
— the call, the bytes it covered, the launching frame judged by module, the phase and step from
the watch's position at the call — and the honest answer where there is no CUDA API. Pure
Python: the records are made by the watcher's own ``record`` from a real Python stack, as its
C callback does on a GPU (the callback itself runs on the GPU host: docs/gpu.md).
"""

from __future__ import annotations

import pytest

from workbook.hooks.watch import apiwrites
from workbook.run import integrity
from workbook.run.writer import sanitizer

MARK = {"name": "reasoning_start_token_ids", "ptr": 0x7f0000001000, "nbytes": 4}
END = {"name": "reasoning_end_token_ids", "ptr": 0x7f0000001200, "nbytes": 8}
CACHE = {"name": "cached_last_start", "ptr": 0x7f0000002000, "nbytes": 64}
RANGES = [MARK, END, CACHE]


@pytest.mark.parametrize("dst,nbytes,want", [
    (MARK["ptr"], 4, [("reasoning_start_token_ids", 0, 3, True)]),          # the whole marker
    (MARK["ptr"] + 2, 1, [("reasoning_start_token_ids", 2, 2, False)]),      # one byte inside
    (MARK["ptr"] - 16, 18, [("reasoning_start_token_ids", 0, 1, False)]),    # runs in from below
    (MARK["ptr"] + 4, 0x1fc, []),                                            # the gap: no hit
    (MARK["ptr"], 0x208, [("reasoning_start_token_ids", 0, 3, True),         # over two markers
                          ("reasoning_end_token_ids", 0, 7, True)]),
    (CACHE["ptr"] + 60, 8, [("cached_last_start", 60, 63, False)]),          # past the end
])
def test_overlap_table(dst, nbytes, want):
    got = [(o["tensor"], o["first_byte"], o["last_byte"], o["whole"])
           for o in apiwrites.overlap(dst, nbytes, RANGES)]
    assert got == want


def _user_copy(w: apiwrites.ApiWatch, call: str, dst: int, nbytes: int, memset: bool):
    """Stands for a user's function that copies into an alias of a marker: the watcher's
    callback records the stack from here."""
    return w.record(call, dst, nbytes, 0 if memset else 0x7f00deadbe00, memset, 0,
                    apiwrites.stack_frames())


POS = {"boundary": "enter propose", "seq": 41, "step": 3, "in_step": True, "phase": "step 3"}


@pytest.mark.parametrize("call,memset,dst,nbytes,relation,rng", [
    ("cudaMemcpyAsync", False, MARK["ptr"], 4, "inside",
     "bytes 0-3 of 4 (the whole tensor) (from 0x7f00deadbe00)"),
    ("cudaMemsetAsync", True, MARK["ptr"], 4, "inside",
     "bytes 0-3 of 4 (the whole tensor) (value 0x0)"),
    ("cuMemsetD8Async", True, MARK["ptr"] - 12, 16, "running into",
     "bytes 0-3 of 4 (the whole tensor) (value 0x0)"),
])
def test_api_writer_names_call_bytes_frame_step(tmp_path, call, memset, dst, nbytes, relation,
                                                rng):
    w = apiwrites.ApiWatch(str(tmp_path), where=lambda: dict(POS))
    w.set_ranges(RANGES)
    assert _user_copy(w, call, dst, nbytes, memset) is not None
    doc = sanitizer.read_api_writes(str(tmp_path / "watch.json"))  # written beside it
    assert doc["records"][0]["call"] == call
    wr = sanitizer.api_writer(doc, {"layout": RANGES})
    assert wr["call"] == call and wr["tensor"] == "reasoning_start_token_ids"
    assert wr["relation"] == relation and wr["range"] == rng
    assert wr["function"] == "_user_copy" and wr["module"] == "tests.test_api_writes"
    assert (wr["phase"], wr["step"]) == ("step 3", 3)
    text = integrity.writer_text(wr)
    assert text.startswith(f"CUDA API call {call}, write of {nbytes} bytes, {relation} "
                           "reasoning_start_token_ids, " + rng)
    assert "from _user_copy in " in text and "(module tests.test_api_writes)" in text
    assert text.endswith("during step 3 (the watch's record)")
    assert "None" not in text


def test_suspended_and_capped(tmp_path):
    w = apiwrites.ApiWatch(None, where=None)
    w.set_ranges(RANGES + [{"name": "empty", "ptr": 0x10, "nbytes": 0}])
    assert [r["name"] for r in w.ranges] == [MARK["name"], END["name"], CACHE["name"]]
    for _ in range(apiwrites.MAX_RECORDS + 3):
        _user_copy(w, "cudaMemcpyAsync", MARK["ptr"], 4, False)
    d = w.to_dict()
    assert len(d["records"]) == apiwrites.MAX_RECORDS and d["dropped"] == 3
    wr = sanitizer.api_writer(d)
    assert wr["phase_source"].startswith("the Python stack of the call")
    assert sanitizer.api_writer({"records": []}) is None and sanitizer.api_writer(None) is None


def test_not_available_on_cpu():
    req = apiwrites.requirements("cpu")
    assert not req["ok"] and "not available on this platform" in req["message"]
    w, st = apiwrites.attach("cpu", None)
    assert w is None and st["on"] is False and "not available on this platform" in st["message"]


def test_stage_plan_on_cpu_says_not_available(tmp_path):
    from workbook.core.config import RunConfig
    from workbook.run.writer import stage as sanistage

    st = sanistage.plan(RunConfig.from_params({"sanitize": "api", "watch": True}), str(tmp_path))
    assert st["mode"] == "skipped" and "not available on this platform" in st["message"]
    lines = integrity.writer_lines(st, None)
    assert lines == [f"sanitizer stage: {st['message']}"]


def test_stage_lines_name_the_watcher():
    stage = {"mode": "api", "verdict": "no read-only permission (CUPTI only)",
             "api_writes": "1 write(s) through the CUDA API into watched memory "
                           "(212 memcpy/memset calls checked)"}
    lines = integrity.writer_lines(stage, None)
    assert lines[1] == ("CUDA API watcher (CUPTI): 1 write(s) through the CUDA API into watched "
                        "memory (212 memcpy/memset calls checked)")
