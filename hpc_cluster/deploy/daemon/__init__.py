"""The cluster daemon's side: the process (run.py), its jobs (jobs.py, arrays.py), pools,
polling and the scheduler as a batch job. `python -m hpc_cluster.deploy.daemon PLAN` runs it."""
