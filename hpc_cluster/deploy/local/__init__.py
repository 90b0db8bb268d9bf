"""LocalCluster's room: the cluster class (cluster.py) and its scheduler process (scheduler.py)."""
