"""The README's first command, `hpc-cluster demo`, run as a user runs it, and the README's
KilledWorker sample checked against the message the demo really prints."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

HPC_CLUSTER = Path(sys.executable).with_name("hpc-cluster")     # the installed console script
README = Path(__file__).resolve().parents[2] / "README.md"


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> str:
    assert HPC_CLUSTER.exists(), f"{HPC_CLUSTER} is missing: install with scripts/setup.sh"
    # ~11 s on a quiet 2-core machine; the bound is for a loaded one.
    proc = subprocess.run([str(HPC_CLUSTER), "demo"], cwd=tmp_path_factory.mktemp("demo"),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def test_the_demo_does_work_and_explains_a_worker_death(demo):
    out = demo
    # 1. Work done: 64 samples and their tree of sums give pi.
    m = re.search(r"pi ~ (\d\.\d+)\s+\(127 tasks in [\d.]+ s\)", out)
    assert m and abs(float(m.group(1)) - 3.14159) < 0.01, out
    # 2. The segfaulting task: KilledWorker names the cause and the signal; the rest finished.
    assert "KilledWorker, cause='crash':" in out, out
    assert re.search(r"Cause: crash: the worker died of signal 11 \(SIGSEGV\) while running "
                     r"'_crash_in_c_extension-\w+'", out), out
    assert re.search(r"nanny: worker pid \d+ ended with signal 11 \(SIGSEGV\), peak RSS [\d.]+ MiB", out), out
    assert "the 20 healthy tasks all finished: True" in out
    # 3. client.deaths(): every death is a crash blamed on that task (allowed_failures=3: 4 deaths).
    deaths = re.findall(r"^\s+(worker-\d)\s+(\S+)\s+blamed=(\S+)\s+(.*)$", out, re.M)
    assert len(deaths) == 4, out
    assert all(cause == "crash" and blamed == "True" and "SIGSEGV" in text for _, cause, blamed, text in deaths)
    assert re.search(r"^done in [\d.]+ s$", out, re.M)


def _shape(line: str) -> str:
    """A message line with its particulars (keys, numbers, times, the crash site's frames) blanked out."""
    line = re.sub(r"\d+(\.\d+)?", "N", re.sub(r"'[^']*'", "'KEY'", line.strip()))
    return re.sub(r"\w+ \([\w./]+:N\)", "FUNC (FILE:N)", line)


def test_the_readmes_killedworker_sample_has_the_real_messages_shape(demo):
    m = re.search(r"```\nhpc_cluster\.TaskCrashedError: (.*?)```", README.read_text(), re.S)
    assert m, "README.md's KilledWorker sample is gone"
    sample = m.group(1).splitlines()
    real = demo.split("KilledWorker, cause='crash':\n", 1)[1].split("\n   the 20 healthy tasks")[0]
    assert [_shape(x) for x in sample] == [_shape(x) for x in real.splitlines()], real
