"""A batch system's own settings (keywords), declared by its adapter.

An adapter lists what only its batch system reads, as `keywords = (AdapterOption(...), ...)`:
LSF's ncpus and mem, HTCondor's disk, a plugin's own. config/ collects them from the installed
adapters through the `hpc_cluster.adapters` entry points (config/adapter_options.py), so each is a
keyword of the cluster classes, a key of a site's YAML, an HPC_CLUSTER_<NAME> variable and a key
of dask-jobqueue's `jobqueue.<section>`, checked like the core settings (config/schema.py) and
refused, with `instead`'s advice, on another batch system that declares its own keywords. The
values that are set reach the adapter as `JobSpec.batch_options` (and `configure()`).

A declaration is data: nothing here runs a command or reads a file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

# The kinds config checks by itself (config/schema.py's validators); an option of another kind
# gives its own `check`.
STANDARD_KINDS = ("int > 0", "int >= 0", "size", "seconds", "bool", "str", "path", "list of str", "map str->str")


@dataclass(frozen=True)
class AdapterOption:
    """One setting of one batch system (or of several that share it, e.g. PBS's and Grid
    Engine's resource_spec: the same object in both adapters).

    name     the keyword and YAML key (snake_case; jobqueue.yaml's hyphenated spelling is read too)
    kind     how it reads, for docs and for HPC_CLUSTER_* values: one of STANDARD_KINDS, or a
             kind of its own with `check`
    help     one line for docs/configuration.md's table and `hpc-cluster config init`
    default  as a user would write it; None: unset (parsed through the check when used)
    check    (key, value as written) -> parsed value, or ValueError naming the key and what to
             write instead; None: config's own check for `kind`
    example  shown (commented) by `config init` when the default is None
    aliases  other names for it
    jobqueue its key in dask-jobqueue's jobqueue.<section> ("" : the hyphenated name; None: not read there)
    instead  what a user of another batch system writes instead (the refusal's advice), e.g. "cores"
    elsewhere  what another batch system (one that declares its keywords) does with it when it is
             set: "refuse" (a ConfigError with `instead`) or "ignore" (how to call a command, as
             LSF's use_stdin: harmless elsewhere, and never passed to another adapter)
    per_pool a worker pool (pools=) may set its own value (config/pools.py)
    """

    name: str
    kind: str
    help: str
    default: Any = None
    check: Callable[[str, Any], Any] | None = None
    example: Any = None
    aliases: tuple[str, ...] = ()
    jobqueue: str | None = ""
    instead: str = "job_extra_directives"
    elsewhere: str = "refuse"
    per_pool: bool = False

    @property
    def jobqueue_key(self) -> str | None:
        return self.name.replace("_", "-") if self.jobqueue == "" else self.jobqueue


__all__ = ["AdapterOption", "STANDARD_KINDS"]
