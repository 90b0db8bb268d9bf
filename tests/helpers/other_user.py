"""A second, unprivileged user on this machine (issue 34: a login node shared by many users).

The tests run as root and make the user themselves (`useradd`, idempotent); what it tries runs
as real processes under its own uid (`runuser`), never as root pretending. It is given an
interpreter it can execute (the venv's python may live under a 0700 /root: the system's python
of the same version is used then) and the package on a PYTHONPATH it can read.

What it tries are the probes below, run as `python -m helpers.other_user` with their arguments
as JSON on stdin (never on the command line: a probe handed the secret to search files for must
not put it where every user's `ps` shows it) and their findings as JSON on stdout. The probes
import only the standard library, and the package where they speak its protocol.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import pwd
import shutil
import site
import socket
import ssl
import subprocess
import sys
from pathlib import Path

OTHER_USER = "hpcother"
TESTS_DIR = Path(__file__).resolve().parents[1]
# Each probe waits this long at most for an answer or a close; the server answers at once
# (refusals are immediate), so this only bounds a hang, on a machine of any speed.
PROBE_TIMEOUT = 30.0


# -- as root: the user and how to run things as it ------------------------------------------------
def ensure_other_user() -> pwd.struct_passwd:
    """The second user, made if missing (its own group and home). Left in place afterwards: it
    holds nothing, and the next run (or a parallel one) reuses it."""
    try:
        return pwd.getpwnam(OTHER_USER)
    except KeyError:
        pass
    made = subprocess.run(["useradd", "--create-home", "--user-group", "--shell", "/bin/sh", OTHER_USER],
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60)
    if made.returncode not in (0, 9):           # 9: made meanwhile by a parallel run
        raise RuntimeError(f"useradd {OTHER_USER} failed (exit {made.returncode}): {made.stderr.strip()}")
    return pwd.getpwnam(OTHER_USER)


def _other_env(extra: dict | None = None) -> dict:
    """A clean environment for the other user: nothing of root's (its XDG_CONFIG_HOME, proxies,
    HPC_CLUSTER_* settings) leaks into what the other user sees."""
    user = pwd.getpwnam(OTHER_USER)
    path = ["/usr/local/bin", "/usr/bin", "/bin", "/usr/local/sbin", "/usr/sbin", "/sbin"]
    for tool in ("scancel", "squeue"):          # the batch system's commands, wherever installed
        found = shutil.which(tool)
        if found and os.path.dirname(found) not in path:
            path.append(os.path.dirname(found))
    env = {"PATH": os.pathsep.join(path), "HOME": user.pw_dir, "USER": OTHER_USER, "LOGNAME": OTHER_USER,
           "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONNOUSERSITE": "1"}
    if os.environ.get("SLURM_CONF"):
        env["SLURM_CONF"] = os.environ["SLURM_CONF"]
    env.update(extra or {})
    return env


def run_as_other_user(argv: list[str], env: dict | None = None, input: str | None = None,
                      timeout: float = 120) -> subprocess.CompletedProcess:
    """`argv` run by the other user (its uid, its groups, its home as the working directory)."""
    user = ensure_other_user()
    return subprocess.run(["runuser", "-u", OTHER_USER, "--", *argv], env=_other_env(env), input=input,
                          stdin=None if input is not None else subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=timeout, cwd=user.pw_dir if os.path.isdir(user.pw_dir) else "/")


@functools.lru_cache(maxsize=1)
def other_user_python() -> tuple[str, str]:
    """(interpreter, PYTHONPATH) with which the other user imports this package and these
    helpers; LookupError saying why there is none. The interpreter is ours if that user may run
    it, else another of the same version (our site-packages hold extensions built for it)."""
    import hpc_cluster
    want = "%d.%d" % sys.version_info[:2]
    roots = [str(TESTS_DIR), str(Path(hpc_cluster.__file__).resolve().parents[1]), *site.getsitepackages()]
    pythonpath = os.pathsep.join(dict.fromkeys(roots))
    candidates = [sys.executable, os.path.realpath(sys.executable), getattr(sys, "_base_executable", None),
                  f"/usr/bin/python{want}", f"/usr/local/bin/python{want}", shutil.which(f"python{want}")]
    tried = []
    for python in dict.fromkeys(c for c in candidates if c and os.path.exists(c)):
        version = run_as_other_user([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"])
        if version.returncode != 0 or version.stdout.strip() != want:
            tried.append(f"{python}: {(version.stderr.strip().splitlines() or [version.stdout.strip()])[-1]}")
            continue
        imports = run_as_other_user([python, "-c", "import hpc_cluster.protocol.comm, helpers.wire"],
                                    env={"PYTHONPATH": pythonpath})
        if imports.returncode == 0:
            return python, pythonpath
        tried.append(f"{python} cannot import the package from {pythonpath}: "
                     f"{(imports.stderr.strip().splitlines() or ['?'])[-1]}")
    raise LookupError(f"user {OTHER_USER} has no Python {want} that imports hpc_cluster ({'; '.join(tried)}); "
                      "the checkout and its site-packages must be readable by every user, as a login "
                      "node's shared software is")


def run_python_as_other_user(args: list[str], env: dict | None = None,
                             timeout: float = 120) -> subprocess.CompletedProcess:
    """`python ARGS` as the other user, with this package importable (other_user_python)."""
    python, pythonpath = other_user_python()
    return run_as_other_user([python, *args], env={"PYTHONPATH": pythonpath, **(env or {})}, timeout=timeout)


def probe_as_other_user(probe: str, *args):
    """What the probe `probe` (below) found, run by the other user."""
    python, pythonpath = other_user_python()
    done = run_as_other_user([python, "-m", "helpers.other_user"], env={"PYTHONPATH": pythonpath},
                             input=json.dumps({"probe": probe, "args": list(args)}), timeout=4 * PROBE_TIMEOUT)
    if done.returncode != 0:
        raise RuntimeError(f"probe {probe} failed as {OTHER_USER} (exit {done.returncode}):\n{done.stderr}")
    return json.loads(done.stdout)


# -- as the other user: the probes ----------------------------------------------------------------
def _errno_name(exc: OSError) -> str:
    return errno.errorcode.get(exc.errno, str(exc.errno))


def probe_open(paths: list[str]) -> dict:
    """path -> 'read' / 'listed', or the errno name of the refusal (EACCES)."""
    out = {}
    for path in paths:
        try:
            if os.path.isdir(path):
                os.listdir(path)
                out[path] = "listed"
            else:
                with open(path, "rb") as f:
                    f.read(1)
                out[path] = "read"
        except OSError as exc:
            out[path] = _errno_name(exc)
    return out


def probe_signal(pids: list[int], signum: int) -> dict:
    """pid -> 'sent' or the errno name of the refusal (EPERM)."""
    out = {}
    for pid in pids:
        try:
            os.kill(pid, signum)
            out[str(pid)] = "sent"
        except OSError as exc:
            out[str(pid)] = _errno_name(exc)
    return out


def probe_files_holding(top: str, needles: list[str]) -> dict:
    """Every file under `top` this user can read, and those holding one of `needles`."""
    read, holding = 0, []
    for root, _dirs, files in os.walk(top):
        for name in files:
            path = os.path.join(root, name)
            try:
                with open(path, "rb") as f:
                    data = f.read()
            except OSError:
                continue
            read += 1
            holding += [path for n in needles if n.encode() in data]
    return {"read": read, "holding": holding}


def _connection(address: str) -> socket.socket:
    """A raw connection to `address`; for a tls:// one, TLS with no certificate of the
    cluster's (the other user has none) and no check of the server's."""
    from hpc_cluster.protocol.comm import parse_address
    sock = socket.create_connection(parse_address(address), timeout=PROBE_TIMEOUT)
    if address.startswith("tls://"):
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        sock = ctx.wrap_socket(sock)
    return sock


def _rest_until_closed(sock: socket.socket) -> tuple[bytes, bool]:
    """What the peer still sends, and whether it closed (within PROBE_TIMEOUT)."""
    got = b""
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return got, True
            got += data
    except (ConnectionResetError, ssl.SSLError, BrokenPipeError):
        return got, True
    except socket.timeout:
        return got, False


def probe_forged_handshake(address: str) -> dict:
    """Our handshake without the secret: the listener's challenge taken, answered with a
    made-up proof. `welcomed`: the peer let us in; `closed`: it hung up on us."""
    from hpc_cluster.protocol.comm import MAGIC
    from hpc_cluster.protocol.frames import dumps
    from hpc_cluster.protocol.messages import Op
    from helpers.wire import read_message
    try:
        with _connection(address) as sock:
            sock.sendall(MAGIC + b"".join(dumps({"op": Op.AUTH.value, "nonce": os.urandom(32)})))
            challenge = read_message(sock)
            sock.sendall(b"".join(dumps({"op": Op.AUTH_PROOF.value, "proof": os.urandom(32),
                                         "info": {"role": "client"}})))
            rest, closed = _rest_until_closed(sock)
    except (OSError, ssl.SSLError, ConnectionError) as exc:
        return {"stage": "before the proof", "error": repr(exc), "welcomed": False, "closed": True}
    return {"stage": "after the proof", "challenge": len(challenge), "welcomed": Op.WELCOME.value.encode() in rest,
            "closed": closed}


def probe_garbage(address: str) -> dict:
    """Bytes that are no protocol of ours: `closed` if the peer hung up."""
    try:
        with _connection(address) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + bytes(range(256)) * 4)
            got, closed = _rest_until_closed(sock)
    except (OSError, ssl.SSLError) as exc:
        return {"closed": True, "error": repr(exc)}
    return {"closed": closed, "answer": got[:64].hex()}


def probe_client(address: str, cluster_file: str) -> dict:
    """The public Client with a secret of its own making, and with the owner's cluster file."""
    from hpc_cluster import Client
    out = {}
    for how, kwargs in (("secret", {"address": address, "secret": os.urandom(32)}),
                        ("cluster_file", {"cluster_file": cluster_file})):
        try:
            with Client(timeout=PROBE_TIMEOUT, **kwargs):
                out[how] = "connected"
        except Exception as exc:              # what refused it, for the test to judge
            out[how] = f"{type(exc).__name__}: {exc}"
    return out


def probe_http(urls: list[str]) -> dict:
    """url -> the HTTP status (an https dashboard's certificate is not checked)."""
    import urllib.error
    import urllib.request
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=ctx))
    out = {}
    for url in urls:
        try:
            with opener.open(url, timeout=PROBE_TIMEOUT) as reply:
                out[url] = reply.status
        except urllib.error.HTTPError as exc:
            out[url] = exc.code
        except OSError as exc:
            out[url] = repr(exc)
    return out


PROBES = {"open": probe_open, "signal": probe_signal, "files_holding": probe_files_holding,
          "forged_handshake": probe_forged_handshake, "garbage": probe_garbage, "client": probe_client,
          "http": probe_http}


def main() -> None:
    asked = json.load(sys.stdin)
    json.dump(PROBES[asked["probe"]](*asked["args"]), sys.stdout)


if __name__ == "__main__":
    main()
