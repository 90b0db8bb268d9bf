"""The cluster daemon's side: the process (run.py), its request handlers (handlers.py), its
jobs (jobs.py: their I/O, policy.py: how many, pure; arrays.py), pools, polling and the
scheduler as a batch job. `python -m hpc_cluster.deploy.daemon PLAN` runs it."""
