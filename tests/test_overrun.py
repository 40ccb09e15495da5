"""Overruns (issue #27): a writer's whole access range read from memcheck's faulting accesses
against the markers' red zones, and the layout comparison's "overrun" / "pointer write".

Table tests over compute-sanitizer texts in the format of the committed H200 logs
(``outputs/h200/writer-2026120*/…/sanitizer.log``: "Invalid __global__ write of size 4 bytes",
"Access to 0x… is not writable", "and is inside the nearest allocation at 0x… of size N bytes",
"… is out of bounds", "and is N bytes after the nearest allocation at …", the host backtrace with
Python frames) and over layouts; no GPU, no engine. The padding itself (``workbook.hooks.
redzone``) and the overrun writer (``workbook.hooks.watch.writers``, Triton's interpreter) run here on
CPU tensors.
"""

import json
import os
import subprocess
import sys

import pytest
from conftest import evidence_json, evidence_text

from workbook.run import integrity
from workbook.run.writer import overrun
from workbook.run.writer import sanitizer

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
H200 = os.path.join(REPO, "outputs", "h200", "writer-20261205", "tiny-alias_fill-caching-on",
                    "pass1-none")

KERNEL = "_fill_kernel+0x110 in user_kernels.py:33"
FRAMES = ["__call__ in driver.py:713", "run in jit.py:744", "<lambda> in jit.py:370",
          "fill_ids in user_kernels.py:41", "overrun in writers.py:140",
          "forward in writers.py:190", "_run_model in speculator.py:424",
          "propose in speculator.py:312", "_dummy_run in model_runner.py:803",
          "profile_run in model_runner.py:868"]


def record(addr: int, tail: str, size: int = 4, kernel: str = KERNEL, thread: int = 0) -> str:
    """One memcheck record as compute-sanitizer 2025.3 prints it (the H200 logs' lines)."""
    what, _, rest = tail.partition("|")
    return "\n".join([
        f"========= Invalid __global__ write of size {size} bytes",
        f"=========     at {kernel}",
        f"=========     by thread ({thread},0,0) in block (0,0,0)",
        f"=========     Access to {hex(addr)} is {what}",
        f"=========     and is {rest}",
        "=========     Saved host backtrace up to driver entry point at kernel launch time",
        "=========         Host Frame: launch [0x1c81] in "
        "__triton_launcher.cpython-312-x86_64-linux-gnu.so",
        "=========         Host Frame: _start [0x257a04] in python3",
        *[f"=========         Host Frame: {f}" for f in FRAMES],
        "========= "])


def log(records: list[str], n: int | None = None) -> str:
    n = len(records) + 1 if n is None else n
    return "\n".join(["========= COMPUTE-SANITIZER", *records,
                      '========= Program hit CUDA_ERROR_LAUNCH_FAILED (error 719) due to '
                      '"unspecified launch failure" on CUDA API call to cuLaunchKernelEx.',
                      "=========     Saved host backtrace up to driver entry point at error",
                      "========= ", "========= Target application returned an error",
                      f"========= ERROR SUMMARY: {n} errors", ""])


def inside(base: int, size: int) -> str:
    return f"not writable|inside the nearest allocation at {hex(base)} of size {size} bytes"


def oob(dist: int, direction: str, base: int, size: int) -> str:
    return (f"out of bounds|{dist} bytes {direction} the nearest allocation at {hex(base)} of "
            f"size {size} bytes")


# ---- layouts: the tiny H200 layout (caching on) with the markers in padded buffers ---------

SEG = 0x7FF4E3400000
R = 256  # red zone bytes each side


def padded(name, base, size, nbytes=4):
    p = base + R
    return {"name": name, "ptr": p, "ptr_hex": hex(p), "nbytes": nbytes,
            "redzone": {"base": base, "size": size, "below": [base, p],
                        "above": [p + nbytes, base + size]}}


def plain(name, p, nbytes):
    return {"name": name, "ptr": p, "ptr_hex": hex(p), "nbytes": nbytes}


START_BASE = SEG + 0xCA000  # caching on: a 1024-byte block (516 asked, rounded)
ON = [plain("cached_scan_pos", SEG + 0xC9400, 32), plain("canary.post1", SEG + 0xC9E00, 256),
      padded("reasoning_start_token_ids", START_BASE, 1024),
      padded("natural_reasoning_end_token_ids", START_BASE + 1024, 1024),
      padded("reasoning_end_token_ids", START_BASE + 2048, 1024)]
START = START_BASE + R
EVIDENCE_ON = {"at_state_creation": {"tensors": {"reasoning_start_token_ids": {
    "neighbours": [{"offset": -R - 512, "size": 512, "state": "active_allocated",
                    "watched": None,
                    "allocated_by": ["__init__ in /tmp/vllm-site/vllm/v1/worker/gpu/sample/"
                                     "logprob.py:245"]},
                   {"offset": -R, "size": 1024, "state": "active_allocated",
                    "watched": "reasoning_start_token_ids", "allocated_by": []}]}}}}

OFF_BASE = 0x7F5309DCA000  # caching off: the padded buffer is its own cudaMalloc (516 bytes)
OFF = [padded("reasoning_start_token_ids", OFF_BASE, 516),
       padded("natural_reasoning_end_token_ids", OFF_BASE + 1024, 516),
       padded("reasoning_end_token_ids", OFF_BASE + 2048, 516)]
OFF_START = OFF_BASE + R


def run_from(start: int, end: int, layout, base: int, size: int, below_oob=None):
    """The records a writer of 4-byte stores over [start, end) leaves: an access faults in a
    read-only region (a marker's padded buffer) or outside any allocation (``below_oob``:
    [lo, hi) of a gap, with the allocation it lies after)."""
    recs = []
    for a in range(start, end, 4):
        if base <= a < base + size:
            recs.append(record(a, inside(base, size), thread=(a - start) // 4))
        elif below_oob and below_oob[0] <= a < below_oob[1]:
            prev, psize = below_oob[2], below_oob[3]
            recs.append(record(a, oob(a - prev - psize, "after", prev, psize),
                               thread=(a - start) // 4))
    return recs


# the overrun writer (writers.overrun): 4-byte stores from 1 KiB below the marker to its end
OVERRUN_ON = log(run_from(START - 1024, START + 4, ON, START_BASE, 1024))
# caching off: the cudaMalloc below ends 508 bytes under the padded buffer (a 516-byte
# allocation in a 1024-byte slot): the gap faults as "out of bounds … after" it
OVERRUN_OFF = log(run_from(OFF_START - 1024, OFF_START + 4, OFF, OFF_BASE, 516,
                           below_oob=(OFF_BASE - 508, OFF_BASE, OFF_BASE - 1024, 516)))
# a neighbour's write that stops 64 bytes short of the marker (only the red zone faults)
SHORT_ON = log(run_from(START - 1024, START - 64, ON, START_BASE, 1024))
# a write that starts inside the red zone (128 bytes below the marker)
IN_ZONE = log(run_from(START - 128, START + 4, ON, START_BASE, 1024))
# a write past the marker's end into its red zone above, to the block's last byte
ABOVE_ON = log(run_from(START, START_BASE + 1024, ON, START_BASE, 1024))
# a write whose lowest fault lies in a read-only block past a canary's bytes
CANARY = SEG + 0xC9E00
FROM_CANARY = log([record(CANARY + 256, inside(CANARY, 512))]
                  + run_from(START_BASE, START + 4, ON, START_BASE, 1024))
# 16-byte (vectorized) stores from 64 bytes below the marker: the last one covers the marker and
# 12 bytes of the red zone above it
VECTOR = log([record(a, inside(START_BASE, 1024), size=16) for a in range(START - 64, START + 4, 16)])
# a pointer write: the marker's own 4 bytes (padded)
POINTER_ON = log([record(START, inside(START_BASE, 1024))])


@pytest.mark.parametrize("text,layout,evidence,kind,sentence", [
    (OVERRUN_ON, ON, EVIDENCE_ON, "overrun",
     "runs 4 bytes into reasoning_start_token_ids from below (all 4 bytes), starting at the "
     "first byte of the red zone below reasoning_start_token_ids (the range may go on below "
     "it, in writable memory that memcheck does not check: an allocated block of 512 "
     "bytes allocated by __init__ in /tmp/vllm-site/vllm/v1/worker/gpu/sample/logprob.py:245) "
     "(65 faulting accesses (4 bytes each) over 260 bytes)"),
    (OVERRUN_ON, ON, None, "overrun",
     "runs 4 bytes into reasoning_start_token_ids from below (all 4 bytes), starting at the "
     "first byte of the red zone below reasoning_start_token_ids (the range may go on below "
     "it, in writable memory that memcheck does not check) (65 faulting accesses (4 bytes "
     "each) over 260 bytes)"),
    (OVERRUN_OFF, OFF, None, "overrun",
     "runs 4 bytes into reasoning_start_token_ids from below (all 4 bytes), starting outside "
     "any allocation (0 bytes after the allocation at 0x7f5309dc9c00 of 516 bytes) (192 "
     "faulting accesses (4 bytes each) over 768 bytes)"),
    (SHORT_ON, ON, None, "red zone",
     "runs into the red zone below reasoning_start_token_ids from below, up to 64 bytes short "
     "of it (no faulting access reached the marker itself), starting at the first byte of the "
     "red zone below reasoning_start_token_ids"),
    (IN_ZONE, ON, None, "overrun",
     "runs 4 bytes into reasoning_start_token_ids from below (all 4 bytes), starting in the "
     "red zone below reasoning_start_token_ids, 128 bytes from reasoning_start_token_ids"),
    (ABOVE_ON, ON, None, "overrun",
     "runs 4 bytes into reasoning_start_token_ids from above (all 4 bytes), starting at the "
     "last byte of the red zone above reasoning_start_token_ids"),
    (FROM_CANARY, ON, None, "overrun",
     "runs 4 bytes into reasoning_start_token_ids from below (all 4 bytes), starting in the "
     "read-only allocation at 0x7ff4e34c9e00 of 512 bytes (the block of canary.post1, past its "
     "bytes)"),
    (VECTOR, ON, None, "overrun",
     "runs across reasoning_start_token_ids (all 4 bytes): its lowest access in the red zone "
     "below reasoning_start_token_ids, 64 bytes from reasoning_start_token_ids, its highest in "
     "the red zone above reasoning_start_token_ids, 12 bytes from reasoning_start_token_ids (5 "
     "faulting accesses (16 bytes each) over 80 bytes)"),
    (POINTER_ON, ON, None, "inside",
     "inside reasoning_start_token_ids: bytes 0-3 of 4, every faulting access inside it (1 "
     "faulting access (4 bytes each) over 4 bytes)"),
])
def test_the_writers_whole_range_is_read_against_the_red_zones(text, layout, evidence, kind,
                                                               sentence):
    ex = overrun.first_extent(sanitizer.parse(text), layout, evidence)
    assert ex["kind"] == kind, ex
    assert ex["sentence"].startswith(sentence) or sentence in ex["sentence"], ex["sentence"]
    assert "None" not in ex["sentence"] and "{" not in ex["sentence"]


def test_the_h200_pointer_write_stays_inside_and_its_log_reads_the_same():
    """The committed H200 caching-on alias_fill run (no red zones then): one access, inside the
    marker — the only evidence under which 'pointer write' may be said."""
    text = evidence_text(os.path.join(H200, "sanitizer.log"))
    w = evidence_json(os.path.join(H200, "watch", "watch.json"))
    rep = sanitizer.tie(sanitizer.parse(text), w, None, 1)
    ex = rep["extent"]
    assert ex["kind"] == "inside" and ex["tensor"] == "reasoning_start_token_ids"
    fw = rep["first_writer"]
    assert fw["relation"] == "inside" and fw["size"] == 4
    assert "bytes 0-3 of 4, every faulting access inside it" in integrity.writer_text(fw)


def _watch(layout, evidence=None):
    return {"layout": layout, "layout_evidence": evidence or {},
            "protection": {"mode": "nvtx", "protected": ["reasoning_start_token_ids"],
                           "tool_attached": True},
            "phase_order": ["profiling run"],
            "position": {"phase": "profiling run › drafter propose", "boundary": "enter propose",
                         "step": 0}}


def test_tie_names_the_overrun_as_a_range_not_four_bytes_inside():
    rep = sanitizer.tie(sanitizer.parse(OVERRUN_ON), _watch(ON, EVIDENCE_ON), None, 1)
    fw = rep["first_writer"]
    text = integrity.writer_text(fw)
    assert fw["tensor"] == "reasoning_start_token_ids" and fw["relation"] is None
    assert text.startswith("kernel _fill_kernel, write runs 4 bytes into "
                           "reasoning_start_token_ids from below"), text
    assert "inside reasoning_start_token_ids" not in text
    assert "from fill_ids in user_kernels.py:41" in text
    assert "during profiling run › drafter propose (the watch's record)" in text
    assert "red zones; first: Invalid __global__ write by kernel _fill_kernel runs 4 bytes" \
        in rep["verdict"]


def side(extent, hit=True):
    ch = "profiling run › drafter propose"
    return {"passes": [{"rc": 1, "stopped": None,
                        "verdict": {"phases_run": ["state creation", "profiling run"]}}],
            "culprit": {"verdict": "corrupted" if hit else "intact", "phase": ch,
                        "writer": {"phase": ch, "extent": extent} if hit else None}}


def ext(text, layout):
    return overrun.first_extent(sanitizer.parse(text), layout)


@pytest.mark.parametrize("on,off,starts,must,must_not", [
    (side(ext(OVERRUN_ON, ON)), side(ext(OVERRUN_OFF, OFF)), "overrun: with caching on, the "
     "write runs 4 bytes into reasoning_start_token_ids from below",
     ("with caching off, the write runs 4 bytes", "outside any allocation"),
     ("pointer write",)),
    (side(ext(POINTER_ON, ON)), side(ext(OVERRUN_OFF, OFF)), "overrun: with caching off",
     (), ("pointer write",)),
    (side(ext(SHORT_ON, ON)), side(ext(POINTER_ON, ON)), "overrun: with caching on, the write "
     "runs into the red zone below", ("up to 64 bytes short",), ()),
    (side(ext(POINTER_ON, ON)), side(ext(POINTER_ON, OFF if False else ON)),
     "a pointer write", ("every faulting access lies inside the marker in both",), ("overrun",)),
    (side(ext(POINTER_ON, ON)), side(None), "in either layout", ("tells a pointer write",),
     ("a pointer write:",)),
])
def test_the_layout_comparison_says_overrun_only_on_a_crossing(on, off, starts, must,
                                                               must_not):
    reading = integrity.layout_ab(on, off)["reading"]
    assert reading.startswith(starts), reading
    for m in must:
        assert m in reading, reading
    for m in must_not:
        assert m not in reading, reading
    assert "None" not in reading


def test_launches_split_by_kernel_and_stack():
    other = record(START, inside(START_BASE, 1024), kernel="zero_store+0x90 in writers.py:78")
    parsed = sanitizer.parse(log(run_from(START - 8, START + 4, ON, START_BASE, 1024) + [other]))
    ls = overrun.launches(parsed["errors"])
    assert [len(x["accesses"]) for x in ls] == [3, 1]


def test_a_cut_log_says_the_range_may_be_wider():
    text = log(run_from(START - 64, START + 4, ON, START_BASE, 1024), n=400)
    ex = ext(text, ON)
    assert "memcheck counted 400 errors and printed 18" in ex["sentence"]


# ---- the padding on CPU tensors: values, dtype, shape kept; the red zones laid out ----------

def test_padding_keeps_what_vllm_reads_and_lays_out_the_zones(monkeypatch):
    import types

    import torch

    from workbook.hooks.watch import redzone

    st = types.SimpleNamespace(
        reasoning_start_token_ids=torch.tensor([5], dtype=torch.int32),
        reasoning_end_token_ids=torch.tensor([6, 7], dtype=torch.int32),
        natural_reasoning_end_token_ids=torch.tensor([8], dtype=torch.int32))
    z = redzone.pad(st, 64)
    assert st.reasoning_end_token_ids.tolist() == [6, 7]
    assert st.reasoning_end_token_ids.dtype == torch.int32
    assert st.reasoning_end_token_ids.shape == (2,)
    lay = z.layout()["reasoning_end_token_ids"]
    p = st.reasoning_end_token_ids.data_ptr()
    assert lay["below"] == [p - 64, p] and lay["above"] == [p + 8, p + 72]
    assert lay["size"] == 136 and p % 16 == lay["base"] % 16
    monkeypatch.setenv(redzone.ENV, "0")
    assert redzone.pad(st) is None
    for bad in ("12", "-16", "x"):
        monkeypatch.setenv(redzone.ENV, bad)
        with pytest.raises(redzone.RedZoneError, match=redzone.ENV):
            redzone.size_from_env()


_WRITER = """
import torch, sys
from workbook.hooks.watch import writers
buf = torch.full((320,), 7, dtype=torch.int32)   # 1280 bytes: a neighbour, then the marker
marker = buf[256:257]                             # at byte 1024 of the buffer
writers.WRITE["overrun"](marker)
z = (buf == 0).nonzero().flatten().tolist()
print(z[0], z[-1], len(z), buf[257].item())
"""


def test_the_overrun_writer_runs_from_a_kibibyte_below_into_the_marker():
    """The writer's own bytes, on CPU (Triton's interpreter): 1 KiB below the marker through
    the marker's last byte, nothing past it."""
    env = {**os.environ, "PYTHONPATH": REPO, "TRITON_INTERPRET": "1"}
    p = subprocess.run([sys.executable, "-c", _WRITER], env=env, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.split() == ["0", "256", "257", "7"], p.stdout


def _h200_side(kind: str, caching: str) -> dict:
    """A committed H200 run (2026-12-04, markers read-only, no red zones then) re-read: its
    summary with the writer re-tied from its own memcheck log and watch.json."""
    d = os.path.join(REPO, "outputs", "h200", "writer-20261204", f"tiny-{kind}-caching-{caching}")
    s = evidence_json(os.path.join(d, "watch-summary.json"))
    w = evidence_json(os.path.join(d, "pass1-none", "watch", "watch.json"))
    text = evidence_text(os.path.join(d, "pass1-none", "sanitizer.log"))
    fw = sanitizer.tie(sanitizer.parse(text), w, None, 1)["first_writer"]
    return {**s, "culprit": {**s["culprit"], "writer": fw}}


@pytest.mark.parametrize("kind", ["alias_fill", "triton_store"])
def test_the_h200_alias_and_triton_writers_read_as_pointer_writes(kind):
    """Re-read with the access ranges, the H200's alias fill_ and Triton store (one access each,
    inside the marker, caching on and off) are what the old reading said: pointer writes."""
    reading = integrity.layout_ab(_h200_side(kind, "on"), _h200_side(kind, "off"))["reading"]
    assert reading.startswith("a pointer write"), reading


# ---- a long run that memcheck stopped short (issue 40) ----------------------------------------
# A user's kernel storing from 600 bytes below the start marker upward, in programs of 64
# stores: memcheck reported the first program's 64 faulting stores (256 of 604 bytes) and
# stopped the kernel (the launch failed) — all of them in canary.post1 and the read-only rest of
# its block, none in the marker's red zone (256 bytes) or the marker.
STOPPED = log([record(a, inside(CANARY, 512), thread=(a - START + 600) // 4)
               for a in range(START - 600, START - 600 + 256, 4)])
# caching off, the same run stopped in the unallocated gap under the padded buffer: memcheck's
# access line names the nearest allocation — the marker's padded block
STOPPED_OFF = log([record(a, oob(OFF_BASE - a, "before", OFF_BASE, 516))
                   for a in range(OFF_BASE - 344, OFF_BASE - 88, 4)])
# red zones sized past the run's start (4096 bytes each side): its first faulting program lies
# in the marker's own red zone
R4 = 4096
BIG = [plain("canary.post1", START_BASE - 4096 - 512, 256),
       {**padded("reasoning_start_token_ids", START_BASE, 2 * R4 + 512),
        "ptr": START_BASE + R4, "ptr_hex": hex(START_BASE + R4),
        "redzone": {"base": START_BASE, "size": 2 * R4 + 512,
                    "below": [START_BASE, START_BASE + R4],
                    "above": [START_BASE + R4 + 4, START_BASE + 2 * R4 + 512]}}]
BIG_START = START_BASE + R4
STOPPED_BIG = log([record(a, inside(START_BASE, 2 * R4 + 512))
                   for a in range(BIG_START - 600, BIG_START - 600 + 256, 4)])


@pytest.mark.parametrize("text,layout,parts", [
    (STOPPED, ON, [
        "starts in canary.post1 (its byte 168 of 256; 88 bytes of it) and runs on above it, "
        "its highest access in the read-only allocation at 0x7ff4e34c9e00 of 512 bytes (the "
        "block of canary.post1, past its bytes) (64 faulting accesses (4 bytes each) over 256 "
        "bytes)",
        "its highest access ends 88 bytes below the red zone below reasoning_start_token_ids, "
        "344 bytes below the marker itself",
        "memcheck stopped the kernel after these 64 faulting accesses (the launch failed), so "
        "the write covers at least these 256 bytes and may go on past either end"]),
    (STOPPED_OFF, OFF, [
        "no access in watched memory or a red zone (64 faulting accesses (4 bytes each) over "
        "256 bytes)",
        "its highest access ends 88 bytes below the red zone below reasoning_start_token_ids",
        "memcheck's access line points at reasoning_start_token_ids (its padded block at "
        "0x7f5309dca000 is the nearest allocation, 344 bytes above the access at "
        "0x7f5309dc9ea8)",
        "may go on past either end"]),
    (STOPPED_BIG, BIG, [
        "runs into the red zone below reasoning_start_token_ids from below, up to 344 bytes "
        "short of it (no faulting access reached the marker itself)",
        "at least these 256 bytes"]),
])
def test_a_run_memcheck_stopped_short_is_at_least_what_it_saw_and_names_the_marker(text,
                                                                                   layout,
                                                                                   parts):
    ex = overrun.first_extent(sanitizer.parse(text), layout)
    assert ex is not None and ex["at_least"] is True
    for p in parts:
        assert p in ex["sentence"], (p, ex["sentence"])
    assert "from above" not in ex["sentence"] and "None" not in ex["sentence"]
    # nothing in the sentence beyond the evidence: no claim that it reached the marker
    assert "into reasoning_start_token_ids" not in ex["sentence"]


def test_the_default_red_zone_holds_a_run_that_starts_kibibytes_below():
    from workbook.hooks.watch import redzone

    assert redzone.DEFAULT >= 4096 and redzone.DEFAULT % 16 == 0
    assert redzone.size_from_env({}) == redzone.DEFAULT
