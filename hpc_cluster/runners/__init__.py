"""Where batch commands run: a local subprocess (local.py) or a login node over SSH (ssh.py).
Adapters are handed one and never know which."""
