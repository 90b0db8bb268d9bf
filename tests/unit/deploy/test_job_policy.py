"""The job policy (deploy/daemon/policy.py): how many jobs a pool keeps, decided purely from
what the job manager read, with no batch system, scheduler or clock."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from hpc_cluster.deploy.daemon import policy as policy_module
from hpc_cluster.deploy.daemon.policy import DEMAND_WAIT_COUNT, AdaptPolicy, JobPolicy, adaptive_jobs


def rounds(policy: JobPolicy, *wants, **kw) -> list[int]:
    """The targets of successive rounds that each want `want` jobs."""
    out = []
    for want in wants:
        policy = policy.decide(want, **kw)
        out.append(policy.target)
    return out


def test_a_scale_up_is_decided_at_once():
    assert JobPolicy(target=1).decide(5).target == 5
    assert JobPolicy(target=0).decide(1, wait_count=10).target == 1


def test_a_scale_down_needs_wait_count_rounds_in_a_row_that_agree():
    assert rounds(JobPolicy(target=5), 1, 1, 1, wait_count=3) == [5, 5, 1]
    assert rounds(JobPolicy(target=5), 1, 1, wait_count=1) == [1, 1]
    # A round that wants as many as the target starts the count again.
    assert rounds(JobPolicy(target=5), 1, 1, 5, 1, 1, 1, wait_count=3) == [5, 5, 5, 5, 5, 1]
    # Without adapt's wait_count, the demand's cooldown.
    assert rounds(JobPolicy(target=2), *[0] * DEMAND_WAIT_COUNT) == [2] * (DEMAND_WAIT_COUNT - 1) + [0]


def test_a_scale_down_goes_only_as_far_as_every_agreeing_round_wanted():
    # The last tasks finishing: rounds want 1, 1, then 0. One job stays (a task submitted right
    # after finds it, instead of every job draining and a new one starting); 0 takes 3 rounds of 0.
    assert rounds(JobPolicy(target=3), 1, 1, 0, wait_count=3) == [3, 3, 1]
    assert rounds(JobPolicy(target=3), 2, 0, 1, 0, 0, 0, wait_count=3) == [3, 3, 2, 2, 2, 0]
    assert rounds(JobPolicy(target=3), 1, 1, 0, 0, 0, wait_count=3) == [3, 3, 1, 1, 1]
    assert rounds(JobPolicy(target=3), 1, 1, 0, 0, 0, 0, wait_count=3) == [3, 3, 1, 1, 1, 0]


def test_the_pools_demand_raises_the_target_and_its_busy_jobs_stay():
    p = JobPolicy().decide(0, demand=3)
    assert (p.target, p.demand_seen) == (3, True)
    # The demand is gone but two jobs still run its tasks: they stay, the idle one goes after the cooldown.
    p = p.decide(0, demand=0, busy=2).decide(0, demand=0, busy=2)
    assert (p.target, p.lower_rounds, p.demand_seen) == (3, 2, True)
    p = p.decide(0, demand=0, busy=2)
    assert (p.target, p.demand_seen) == (2, True)
    # Nothing runs and nothing is wanted: the demand is forgotten, and the busy count no longer counts.
    p = p.decide(0, demand=0, busy=0)
    assert p.demand_seen is False and p.target == 2
    assert p.decide(0, busy=5).decide(0, busy=5).target == 0


def test_busy_jobs_count_only_after_the_demand_started_jobs():
    # Busy jobs of a pool sized by scale() alone are scale()'s business (a scale-down drains them).
    assert JobPolicy(target=4).decide(1, busy=4, wait_count=1).target == 1


def test_max_jobs_caps_the_size_asked_for_and_the_demand():
    assert JobPolicy().decide(10, max_jobs=4).target == 4
    assert JobPolicy().decide(0, demand=9, max_jobs=2).target == 2
    assert JobPolicy().decide(3, max_jobs=None).target == 3


def test_a_decision_is_a_new_policy_and_leaves_the_old_one_as_it_was():
    old = JobPolicy(target=5)
    new = old.decide(1, wait_count=3)
    assert old == JobPolicy(target=5) and new == JobPolicy(target=5, lower_rounds=1, lower_most=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        old.target = 1


def test_adapt_sizes_for_the_target_duration_within_minimum_and_maximum():
    # 300 s of work, 30 s to do it in, 2 cores a job: 5 jobs.
    assert adaptive_jobs(AdaptPolicy(1, 10, target_duration=30), 300, 2) == 5
    assert adaptive_jobs(AdaptPolicy(1, 3, target_duration=30), 300, 2) == 3
    assert adaptive_jobs(AdaptPolicy(2, None, target_duration=30), 0, 2) == 2
    assert adaptive_jobs(AdaptPolicy(0, None), 300, 2) == 30          # dask's 5 s, no maximum
    assert adaptive_jobs(AdaptPolicy(0, None), 1, 0) == 1             # a job has a core at least


def test_the_policy_module_does_no_io_and_reads_no_clock():
    tree = ast.parse(Path(policy_module.__file__).read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 0}
    relative = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level]
    assert imported <= {"__future__", "dataclasses", "math"} and not relative
