"""Bad input on the command line: one line naming the bad name or value and the valid ones,
exit 2, before any engine starts (each command here returns in seconds: nothing is started)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "workbook.cli", *args], capture_output=True,
                          text=True, timeout=120, cwd=REPO, env={**os.environ, "PYTHONPATH": REPO})


@pytest.mark.parametrize("args,named,valid", [
    (["run", "BADENV"], "'BADENV'", "cpu, h200"),
    (["validate", "BADENV"], "'BADENV'", "cpu, h200"),
    (["serve", "BADENV"], "'BADENV'", "cpu, h200"),
    (["watch", "--env", "BADENV"], "'BADENV'", "cpu, h200"),
    (["run", "cpu", "--only", "BADNAME"], "BADNAME", "reported-mtp"),
    (["serve", "cpu", "--only", "BADNAME"], "BADNAME", "reported-mtp"),
    (["run", "cpu", "--set", "badkey=1"], "badkey", "spec_method"),
    (["serve", "--set", "badkey=1"], "badkey", "spec_method"),
    (["watch", "--set", "badkey=1"], "badkey", "spec_method"),
    (["serve", "--set", "spec_method=foo"], "'foo'", "mtp"),
    (["run", "constraints", "--set", "invariance=maybe"], "'maybe'", "auto, on, off"),
    (["serve", "--logprobs-mode", "foo"], "'foo'", "processed_logprobs"),
    (["serve", "--port", "99999"], "99999", "0-65535"),
    (["check-server", "http://127.0.0.1:9", "--logprobs-mode", "foo"], "'foo'", "raw"),
    (["bogus"], "'bogus'", "check-server"),
])
def test_bad_input_is_one_line_rc2(args, named, valid):
    proc = _cli(*args)
    err = proc.stderr.strip()
    assert proc.returncode == 2, (proc.stdout, err)
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert named in err and all(v in err for v in valid.split(", ")), err
    assert not proc.stdout.strip(), proc.stdout  # nothing started, nothing printed


def test_serve_on_a_busy_port_is_one_line_rc2():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        proc = _cli("serve", "--port", str(s.getsockname()[1]))
    err = proc.stderr.strip()
    assert proc.returncode == 2 and len(err.splitlines()) == 1, err
    assert "already in use" in err and "--port 0" in err and not proc.stdout
