"""How often the scheduler tells its workers a new heartbeat interval (issue 33, point 6).
Counted, not timed: every announcement goes to every worker, so their number times the
cluster's size is the messages a growing cluster costs."""

from hpc_cluster.scheduler.workers import ANNOUNCE_STEP, heartbeat_interval, paced_interval


def announcements(sizes, announced: float = heartbeat_interval(0)):
    """(messages sent to workers, the largest gap between the announced interval and the rule's)
    as the cluster passes through `sizes`, one worker at a time."""
    messages, worst = 0, 1.0
    for n in sizes:
        new = paced_interval(announced, n)
        if new is not None:
            announced = new
            messages += n                         # one to each worker of the cluster
        rule = heartbeat_interval(n)
        worst = max(worst, announced / rule, rule / announced)
    return messages, worst


def test_a_thousand_workers_registering_one_by_one_are_told_a_new_interval_a_handful_of_times():
    # The rule alone changes at every join above 200 workers: 800 announcements to up to 1,000
    # workers each, ~480,000 messages while the cluster grows.
    exact = sum(n for n in range(1, 1001) if heartbeat_interval(n) != heartbeat_interval(n - 1))
    assert exact > 400_000
    messages, worst = announcements(range(1, 1001))
    assert messages < 6_000
    assert worst <= ANNOUNCE_STEP                 # every worker beats within 25% of the rule


def test_the_same_when_they_leave_and_small_clusters_keep_the_rules_steps():
    messages, worst = announcements(range(999, -1, -1), announced=heartbeat_interval(1000))
    assert messages < 6_000 and worst <= ANNOUNCE_STEP
    # 0.5, 1 and 2 s apart by a factor of 2: each step is announced as it is reached
    announced = heartbeat_interval(0)
    for n, interval in ((10, None), (11, 1.0), (49, None), (50, 2.0), (199, None), (200, None), (299, None), (301, 2.505)):
        assert paced_interval(announced, n) == interval, n
        announced = interval or announced
