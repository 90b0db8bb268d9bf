"""What a batch cluster's adapt() hands back (deploy/cluster.py): the policy it set, with
`stop()`, and dask's way of writing its durations. The sizing itself is the daemon's
(deploy/daemon/), which the policy is sent to."""

from __future__ import annotations

from typing import Any

from ..protocol.messages import Op
from .launch import control


class Adaptive:
    """What adapt() set; `stop()` ends it (the cluster keeps its current jobs)."""

    def __init__(self, cluster, **policy):
        self.cluster, self.policy = cluster, policy

    def stop(self):
        pool = self.policy.get("pool")
        return self.cluster._op(lambda: control(self.cluster.cluster_file, Op.ADAPT, stop=True,
                                                **({"pool": pool} if pool else {})))

    def __repr__(self) -> str:
        return f"<Adaptive {self.policy}>"


def adapt_seconds(value: Any, what: str) -> float:
    """dask's durations: a number of seconds, or '1s', '500ms', '2 minutes'."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    from dask.utils import parse_timedelta
    try:
        return float(parse_timedelta(value))
    except (ValueError, KeyError, TypeError):
        raise ValueError(f"adapt({what}={value!r}): give seconds or a duration like '1s', '500ms'") from None
