"""How many jobs a pool keeps: the decision alone, pure (no batch command, no clock, no
scheduler), apart from the job manager that carries it out (jobs.py: submit, poll, cancel).

Each round the job manager reads what the decision needs (the size asked for, the work
queued, the pool's demand and busy jobs) and asks `JobPolicy.decide()` for the next policy,
whose `target` is the jobs to keep. The rules: up at once; down only after several rounds in
a row agree (no submit/cancel churn); jobs started for a pool's demand stay while they run its
tasks; max_jobs caps it all.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

DEMAND_WAIT_COUNT = 3          # rounds in a row without demand before a pool's idle jobs go (as adapt's)


@dataclass
class AdaptPolicy:
    """adapt()'s settings, with dask's meanings and defaults (distributed's Adaptive)."""

    minimum: int = 0                       # jobs
    maximum: int | None = None             # jobs; None: no limit
    interval: float = 1.0                  # seconds between decisions
    wait_count: int = 3                    # decisions in a row that must agree before shrinking
    target_duration: float = 5.0           # size the cluster to finish the queued work in about this


def adaptive_jobs(adapt: AdaptPolicy, workload: float, cores_per_job: int) -> int:
    """adapt()'s choice: jobs to finish `workload` (seconds of queued work, placement.workload)
    in about target_duration, a job's cores running at once, within minimum and maximum."""
    want = math.ceil(workload / (adapt.target_duration * max(1, cores_per_job)))
    return max(adapt.minimum, want if adapt.maximum is None else min(adapt.maximum, want))


@dataclass(frozen=True)
class JobPolicy:
    """What a pool's decisions carry from one round to the next."""

    target: int = 0                        # the jobs we keep: scale()'s, adapt's or the demand's
    lower_rounds: int = 0                  # rounds in a row that wanted fewer than the target
    lower_most: int = 0                    # the most jobs any of those rounds wanted
    demand_seen: bool = False              # jobs were started for the pool's demand and may still run it

    def decide(self, want: int, demand: int = 0, busy: int = 0, max_jobs: int | None = None,
               wait_count: int = DEMAND_WAIT_COUNT) -> "JobPolicy":
        """The next policy, after a round where scale()/adapt() want `want` jobs, the pool's own
        work needs `demand` jobs and `busy` active jobs run a task. Its `target` is the jobs to keep."""
        demand_seen = self.demand_seen or bool(demand)
        if demand_seen:
            # Jobs started for demand stay while they run its tasks; idle ones go after the cooldown.
            want = max(want, demand, busy)
            if not demand and not busy:
                demand_seen = False
        if max_jobs is not None:
            want = min(want, max_jobs)
        # Up at once, down only when several decisions agree: no submit/cancel churn. An
        # explicit scale() lowers the target itself, at once (JobPolicy(target=n)).
        # The rounds agree only as far down as each of them wanted: rounds wanting 1, 1 then 0
        # (the last tasks finishing) keep 1 job, not 0, or work submitted just after would find
        # every job draining and start a new one (the 3 -> 0 -> new job cycle of issue 34).
        if want < self.target:
            lower_most = max(want, self.lower_most) if self.lower_rounds else want
            if self.lower_rounds + 1 < wait_count:
                return dataclasses.replace(self, lower_rounds=self.lower_rounds + 1, lower_most=lower_most,
                                           demand_seen=demand_seen)
            want = lower_most
        return JobPolicy(target=want, lower_rounds=0, demand_seen=demand_seen)
