"""What the tests share: waiting on a condition, fakes, the batch-system simulators, a private sshd,
a browser, a bare worker. tests/conftest.py puts tests/ on sys.path, so `from helpers.wait import ...`."""
