"""Why did my worker die? The node failure, staged for real (scenarios.node_failure): both
variants (nanny, no nanny) at once, each cluster running a long task, the node's slurmd and
the jobs' processes killed and the node marked down, then brought back.

Marked `node_down`: a node marked down ends every job on it, so it must not run beside other
tests that use SLURM; `scripts/test` runs these last, alone (the one-host cluster has one node).
"""

from __future__ import annotations

import pytest

import scenarios as S

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.node_down, pytest.mark.timeout(900)]

BOTH = pytest.mark.parametrize("nanny", [True, False], ids=["nanny", "no-nanny"])


@pytest.fixture(scope="module")
def outcomes(slurm_cluster, slurm_node, tmp_path_factory):
    base = tmp_path_factory.mktemp("node-failure")
    with S.own_config(base):
        got = S.safely(S.node_failure, slurm_node, base / "logs")
    return {("node-failure", nanny): o for o, nanny in zip(got if isinstance(got, list) else [got, got], (True, False))}


@BOTH
def test_node_failure(outcomes, nanny):
    o = S.outcome(outcomes, "node-failure", nanny)
    S.innocent(o, "node-failure")
    assert any("NODE_FAIL" in e for e in o["death"]["evidence"]), o["death"]["evidence"]
