"""The per-cluster secret and the cluster file that carries it (address + secret, mode 0600)."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from pathlib import Path

SECRET_ENV = "HPC_CLUSTER_SECRET"


def new_secret() -> bytes:
    return secrets.token_bytes(32)


def dashboard_token(secret: bytes) -> str:
    """The dashboard's access token (issue 17): derived from the cluster secret, so the
    scheduler process and anyone holding the cluster file agree on it without storing more,
    while the secret itself never appears in a URL, a browser's history or a proxy's log (an
    HMAC cannot be turned back into its key)."""
    return hmac.new(secret, b"hpc-cluster dashboard token", hashlib.sha256).hexdigest()[:32]


def dashboard_link(address: str, secret: bytes) -> str:
    """The dashboard's link: its page (at /status, as dask's) with the token."""
    return f"{address.rstrip('/')}/status?token={dashboard_token(secret)}"


def secret_from_env() -> bytes | None:
    value = os.environ.get(SECRET_ENV)
    if not value:
        return None
    try:
        return bytes.fromhex(value)
    except ValueError:
        raise ValueError(f"${SECRET_ENV} must be the hex secret from the cluster file") from None


def take_secret_from_env() -> bytes | None:
    """The secret from $HPC_CLUSTER_SECRET, removed from this process's environment: the
    worker runs user code, and every subprocess a task starts would otherwise inherit the
    key to the cluster. Who needs it later keeps it in memory (protocol/context.py)."""
    secret = secret_from_env()
    os.environ.pop(SECRET_ENV, None)
    return secret


def private_directory(path: str | os.PathLike, fix: bool = False) -> Path:
    """Create `path` (and missing parents) readable by its owner only. With `fix`, an existing
    directory is made 0700 too: for our own directories, which older versions made 0755."""
    path = Path(path)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if fix and os.stat(path).st_mode & 0o077:
        os.chmod(path, 0o700)
    return path


def open_private(path: str | os.PathLike, mode: str = "ab"):
    """Open a file (a log, an address file) created with mode 0600: what it says (addresses,
    paths, tracebacks of user code) is the user's alone."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if "a" in mode else os.O_TRUNC)
    fd = os.open(path, flags, 0o600)
    os.fchmod(fd, 0o600)                # one an older version left 0644
    return os.fdopen(fd, mode)


def write_cluster_file(path: str | os.PathLike, address: str, secret: bytes, **extra) -> Path:
    """Write atomically with mode 0600: the secret is the only key to the cluster."""
    path = Path(path)
    if not path.parent.exists():
        private_directory(path.parent)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        # The dashboard's token beside the secret: `hpc-cluster status` prints the link with it.
        json.dump({"address": address, "secret": secret.hex(), "dashboard_token": dashboard_token(secret),
                   **extra}, f, indent=1)
    os.replace(tmp, path)
    return path


def read_cluster_file(path: str | os.PathLike) -> dict:
    path = Path(path).expanduser()
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"cluster file {path} does not exist; is the cluster up? "
                                "(`hpc-cluster list` shows running clusters)") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"cluster file {path} is not valid JSON ({exc}); remove it and start the cluster again") from None
    if not isinstance(data, dict) or "address" not in data or "secret" not in data:
        raise ValueError(f"cluster file {path} lacks 'address' or 'secret'")
    data["secret"] = bytes.fromhex(data["secret"])
    return data


def clusters_dir() -> Path:
    """Where `hpc-cluster up` keeps cluster files: $XDG_CONFIG_HOME/hpc-cluster/clusters."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "hpc-cluster" / "clusters"


def cluster_file_for(name: str) -> Path:
    return clusters_dir() / f"{name}.json"


def tls_directory_for(cluster_file) -> Path:
    """NAME.tls beside NAME.json: the certificates made for the cluster (protocol/tls.py), read by
    its jobs where they read its cluster file, removed with it."""
    return Path(cluster_file).with_suffix(".tls")


def journal_for(cluster_file) -> Path:
    """NAME.journal beside NAME.json (scheduler/journal.py): what a restarted daemon resumes from."""
    return Path(cluster_file).with_suffix(".journal")
