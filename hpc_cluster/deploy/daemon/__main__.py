"""`python -m hpc_cluster.deploy.daemon PLAN`: the cluster daemon's command."""

import sys

from .run import main

if __name__ == "__main__":
    sys.exit(main())
