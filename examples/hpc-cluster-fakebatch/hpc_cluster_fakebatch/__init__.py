"""An example third-party batch-system adapter for hpc-cluster (docs/writing-an-adapter.md)."""
