"""distributed's public names, answered with hpc_cluster's (the inner runs of
test_distributed_upstream.py import from here where distributed's tests import from
`distributed`, `distributed.client`, `distributed.lock`, ...: dist_fetch.rewrite()).

A name hpc_cluster lacks is a placeholder of the same name: an exception class nothing of ours
raises (so `pytest.raises(X)` fails), or a class that raises NotImplementedError naming it when
used. A test then fails where it uses the name, not at import, and the table in
docs/migrating-from-distributed.md says why. Nothing here is distributed's."""

from __future__ import annotations

import hpc_cluster


class Missing:
    """Stands for a name of distributed's that hpc_cluster does not have."""

    name = "?"

    def __init__(self, *args, **kwargs):
        # A test's own subclass (a WorkerPlugin of its own) is made: its use then fails where
        # it needs what we lack. The placeholder itself is never made.
        if "name" not in type(self).__dict__:
            return
        raise NotImplementedError(f"hpc_cluster has no {self.name} (distributed's name), or the "
                                  "installed dask/distributed no longer has it")


def stand_in(name: str):
    """A stand-in for `name` (distributed's, or 'module.name' that the installed version lacks)."""
    import distributed
    import distributed.client
    short = name.rsplit(".", 1)[-1]
    theirs = getattr(distributed, short, None) or getattr(distributed.client, short, None)
    if isinstance(theirs, type) and issubclass(theirs, BaseException):
        return type(short, (Exception,), {"__doc__": f"distributed's {name}: hpc_cluster never raises it"})
    return type(short, (Missing,), {"name": name})


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    try:
        value = getattr(hpc_cluster, name)
    except AttributeError:
        value = stand_in(name)
    globals()[name] = value
    return value
