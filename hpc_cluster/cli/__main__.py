"""`python -m hpc_cluster.cli`: the same as the `hpc-cluster` command."""

import sys

from . import main

sys.exit(main())
