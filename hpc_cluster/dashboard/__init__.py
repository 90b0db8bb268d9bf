"""The web dashboard (issue 17): pages and JSON served by the scheduler's process.

`server.Dashboard` listens beside a Scheduler (deploy/ starts it: the cluster daemon and
LocalCluster's scheduler process); `views` builds each /api answer from the scheduler's
state; `static/` holds the one page, its script and its style. It reads the scheduler and is
handed the job manager's table; the scheduler never imports it (tests/unit/test_layering.py).
"""
