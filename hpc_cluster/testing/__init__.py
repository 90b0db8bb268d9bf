"""Helpers for testing hpc-cluster and its plugins: adapter_conformance.py, the adapter test kit."""
