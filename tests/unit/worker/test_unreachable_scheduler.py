"""A worker that cannot reach its scheduler at start ends with one line naming each address it
tried and why each failed, with what to set (issue 33): the line `hpc-cluster why` shows as a
startup death's fix. Real sockets: a port held without listening refuses connections."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from hpc_cluster.scheduler.diagnosis import Cause, Evidence, diagnose
from hpc_cluster.worker.run import cannot_reach


@pytest.fixture
def dead_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))               # bound, never listening: connections are refused
        yield s.getsockname()[1]


def test_the_line_names_every_address_its_tries_and_what_to_set():
    line = cannot_reach({"tcp://10.77.0.1:40123": [12, "no answer: timed out"],
                         "tcp://10.0.0.9:40123": [1, "no route to host"]}, 60, "hpcn1", "10.77.0.11")
    assert line.startswith("cannot reach the scheduler from hpcn1 (routed from 10.77.0.11) within death_timeout "
                           "(60 s): tried tcp://10.77.0.1:40123 (12 tries, last: no answer: timed out); "
                           "tcp://10.0.0.9:40123 (1 try, last: no route to host)")
    assert "interface=" in line and "--interface NAME" in line and "\n" not in line
    assert "(no route to it)" in cannot_reach({"tcp://x:1": [None, "OSError"]}, 5, "n", None)


@pytest.mark.parametrize("nanny", [True, False], ids=["nanny", "no-nanny"])
def test_a_worker_whose_scheduler_refuses_says_so_and_exits_3(tmp_path, dead_port, nanny):
    from hpc_cluster.protocol.clusterfile import new_secret, write_cluster_file
    cluster_file = tmp_path / "c.json"
    write_cluster_file(cluster_file, f"tcp://127.0.0.1:{dead_port}", new_secret())
    proc = subprocess.run([sys.executable, "-m", "hpc_cluster.worker", "--cluster-file", str(cluster_file),
                           "--death-timeout", "2", "--nanny" if nanny else "--no-nanny", "--nthreads", "1"],
                          capture_output=True, text=True, timeout=120)
    said = [line for line in proc.stderr.splitlines() if line.startswith("hpc-cluster worker: cannot reach")]
    assert proc.returncode == 3 and len(said) == 1, proc.stderr
    assert (f"within death_timeout (2 s): tried tcp://127.0.0.1:{dead_port} (" in said[0]
            and "last: connection refused: nothing listens there)" in said[0]), said
    # The diagnosis of a job that ended before its worker registered shows that line as the fix.
    verdict = diagnose(Evidence(log_tail=proc.stderr.splitlines(),
                                accounting={"state": "failed", "exit_code": 3}, registered=False))
    assert verdict.cause == Cause.STARTUP
    assert verdict.advice == "the worker said: " + said[0].split("hpc-cluster worker: ", 1)[1]
