"""dask-worker's flags on our worker: the table in worker/flags.py (pure), the worker's own
argument parser built from it (the two must agree on every flag), and real workers started
with the flags dask-jobqueue users pass: --lifetime drains and retires a worker before its
lifetime ends, --lifetime-restart gives its nanny a fresh worker, --lifetime-stagger draws
a lifetime per worker, and an unsupported flag stops the command with advice."""

from __future__ import annotations

import random
import signal
import socket
import subprocess
import sys
import time

import pytest

from hpc_cluster import Client, LocalCluster
from hpc_cluster.deploy.local.cluster import _child_env
from hpc_cluster.worker.__main__ import build_parser, cpu_count, system_memory
from hpc_cluster.worker.flags import (BY_NAME, FLAGS, REFUSED, SUPPORTED, check_worker_args,
                                      draw_lifetime, drop_flags, ignored_worker_args, memory_limit_bytes,
                                      parse_bytes, parse_duration, port_shares, read_worker_args)
from helpers.funcs import slow
from helpers.wait import wait_until

# A value each flag that takes one accepts, and the setting it gives.
GOOD = {
    "--nthreads": ("4", 4), "--nworkers": ("3", 3), "--nprocs": ("3", 3), "--name": ("w-1", "w-1"),
    "--memory-limit": ("6.52GiB", "6.52GiB"), "--resources": ("GPU=2 MEM=10e9", "GPU=2 MEM=10e9"),
    "--death-timeout": ("2m", 120.0), "--reconnect-window": ("15m", 900.0), "--local-directory": ("$TMPDIR/w", "$TMPDIR/w"),
    "--lifetime": ("55m", 3300.0), "--lifetime-stagger": ("4 minutes", 240.0), "--interface": ("ib0", "ib0"),
    "--protocol": ("tcp://", "tcp://"), "--host": ("0.0.0.0", "0.0.0.0"), "--worker-port": ("3000:3026", "3000:3026"),
    "--pid-file": ("/tmp/w.pid", "/tmp/w.pid"), "--worker-class": ("distributed.Worker", "distributed.Worker"),
    "--dashboard-address": (":8787", ":8787"), "--dashboard-prefix": ("/w", "/w"), "--nanny-port": ("4000", "4000"),
    "--scheduler": ("tcp://10.0.0.1:8786", "tcp://10.0.0.1:8786"), "--cluster-file": ("/c.json", "/c.json"),
    "--heartbeat-interval": ("0.25", 0.25), "--memory-terminate-fraction": ("0.9", 0.9),
    "--memory-target-fraction": ("false", 0.0), "--memory-spill-fraction": ("0.75", 0.75),
    "--memory-pause-fraction": ("0.85", 0.85),
    "--max-message-bytes": ("1000000", 1000000), "--max-frame-bytes": ("1000", 1000), "--log-level": ("debug", "debug"),
    "--nanny-id": ("abc", "abc"), "--ready-fd": ("7", 7), "--owner-pid": ("4242", 4242),
    "--engine": ("distributed", "distributed"), "--executing-fd": ("8", 8), "--running-fd": ("6", 6),
    "--tls-ca-file": ("/c/ca.pem", "/c/ca.pem"), "--tls-cert": ("/c/cert.pem", "/c/cert.pem"),
    "--tls-key": ("/c/key.pem", "/c/key.pem"), "--pool": ("bigmem", "bigmem"),
}
# Each refused flag's advice, in a word or two that must be in its message.
ADVICE = {
    "--scheduler-sni": "host names are not checked", "--listen-address": "--host ADDRESS --worker-port PORT",
    "--contact-address": "use --host", "--scheduler-file": "cluster file", "--preload": "job_script_prologue",
    "--preload-nanny": "job_script_prologue",
}
BAD = [
    ("--lifetime", "abc", "not a duration"), ("--lifetime-stagger", "-5", "not a duration"),
    ("--death-timeout", "soon", "not a duration"), ("--reconnect-window", "later", "not a duration"), ("--memory-limit", "lots", "not an amount of memory"),
    ("--memory-limit", "-1", "not a memory limit"), ("--protocol", "ucx", "only tcp"),
    ("--protocol", "ws://", "only tcp and tls"), ("--nthreads", "-1", "at least 0"), ("--nthreads", "four", "whole number"),
    ("--nworkers", "0", "at least 1"), ("--nworkers", "auto", "whole number"), ("--resources", "GPU", "NAME=NUMBER"),
    ("--worker-port", "70000", "65535"), ("--worker-port", "3010:3000", "FIRST <= LAST"),
    ("--worker-class", "dask_cuda.CUDAWorker", "--resources GPU=1"), ("--pool", "big mem", "not a pool name"),
]


# What a flag needs beside it to make sense (the check refuses it alone; so must the parser).
_TLS = {"--tls-ca-file": ["--tls-ca-file", "ca.pem"], "--tls-cert": ["--tls-cert", "c.pem"],
        "--tls-key": ["--tls-key", "k.pem"]}
NEEDS = {"--lifetime-stagger": ["--lifetime", "1h"], "--lifetime-restart": ["--lifetime", "1h"],
         **{name: [w for other, words in _TLS.items() if other != name for w in words] for name in _TLS}}


def every_name():
    return [(name, f) for f in FLAGS for name in (f.name, *f.aliases)]


# -- the table ---------------------------------------------------------------------------------

def test_the_table_covers_every_flag_of_the_installed_dask_worker():
    dask_worker = pytest.importorskip("distributed.cli.dask_worker")
    names = {o for p in dask_worker.main.params for o in (*p.opts, *p.secondary_opts) if o.startswith("--")}
    assert names - {"--version"} <= set(BY_NAME), sorted(names - set(BY_NAME))
    issue = ["--lifetime", "--lifetime-stagger", "--lifetime-restart", "--resources", "--memory-limit", "--nthreads",
             "--nworkers", "--name", "--death-timeout", "--local-directory", "--no-nanny", "--nanny", "--no-dashboard",
             "--interface", "--protocol", "--host", "--pid-file", "--worker-port"]
    assert [n for n in issue if BY_NAME[n].kind != SUPPORTED] == []
    assert BY_NAME["--nprocs"] is BY_NAME["--nworkers"]


@pytest.mark.parametrize("name", [n for n, f in every_name() if f.kind != REFUSED])
def test_every_accepted_flag_is_read_with_its_value(name):
    flag = BY_NAME[name]
    given = [name] if not flag.takes_value else [name, GOOD[name][0]]
    values, problems = read_worker_args(NEEDS.get(name, []) + given)
    assert problems == []
    assert values[flag.setting] == (flag.const if not flag.takes_value else GOOD[name][1])
    if flag.takes_value:                                  # --flag=value reads the same
        assert read_worker_args(NEEDS.get(name, []) + [f"{name}={GOOD[name][0]}"]) == (values, [])


@pytest.mark.parametrize("name", [f.name for f in FLAGS if f.kind == REFUSED])
def test_every_refused_flag_says_what_to_do_instead(name):
    for given in ([name, "x"], [f"{name}=x"], [name]):
        [problem] = check_worker_args(given + ["--nthreads", "2"])    # its value is not read as a stray
        assert problem.startswith(f"{name} is not supported: ") and ADVICE[name] in problem


@pytest.mark.parametrize("name,value,says", BAD)
def test_bad_values_are_refused_naming_flag_and_value(name, value, says):
    [problem] = check_worker_args([name, value])
    assert problem.startswith(f"{name} {value!r}: ") and says in problem


def test_missing_values_and_values_given_to_switches():
    assert check_worker_args(["--lifetime"]) == [
        "--lifetime needs a value (DURATION): " + BY_NAME["--lifetime"].text]
    [problem] = check_worker_args(["--lifetime", "--nthreads", "2"])          # a flag is not a value
    assert problem.startswith("--lifetime needs a value")
    assert check_worker_args(["--lifetime="]) == [
        "--lifetime '': not a duration; use seconds ('90') or a number with a unit: "
        "'90s', '55m', '4 minutes', '1h', '2d'"]
    assert check_worker_args(["--nanny=yes"]) == ["--nanny takes no value: write --nanny alone, not --nanny=yes"]
    assert check_worker_args(["--nthreads", "-1"])[0].startswith("--nthreads '-1'")   # a number, as argparse sees it


def test_unknown_flags_and_stray_words():
    [problem] = check_worker_args(["--lifetme", "55m"])                       # its value is not a second problem
    assert problem.startswith("--lifetme is not a worker flag; did you mean --lifetime?")
    assert "did you mean --memory-limit?" in check_worker_args(["--memory_limit", "4GB"])[0]
    assert "did you mean" not in check_worker_args(["--gpus", "2"])[0]
    assert "drop the address" in check_worker_args(["tcp://10.0.0.1:8786"])[0]
    assert "prints the worker's help" in check_worker_args(["--help"])[0]


def test_flags_fine_alone_but_not_together():
    def only(args):
        [problem] = check_worker_args(args)
        return problem
    assert "without --lifetime" in only(["--lifetime-restart"])
    assert "without --lifetime" in only(["--lifetime-stagger", "4m"])
    assert "must be less than --lifetime" in only(["--lifetime", "5m", "--lifetime-stagger", "5m"])
    assert "needs the nanny" in only(["--lifetime", "5m", "--lifetime-restart", "--no-nanny"])
    assert check_worker_args(["--lifetime", "5m", "--no-nanny", "--lifetime-restart", "--nanny"]) == []  # last wins
    assert "at least 3 ports" in only(["--nworkers", "3", "--worker-port", "3000:3001"])
    assert check_worker_args(["--nworkers", "3", "--worker-port", "0"]) == []
    assert "give one" in only(["--scheduler", "tcp://a:1", "--cluster-file", "c.json"])


def test_later_flags_win():
    values, _ = read_worker_args(["--nthreads", "2", "--memory-limit", "4GB", "--nthreads=8", "--memory-limit", "0.5",
                                  "--no-nanny", "--nanny"])
    assert (values["nthreads"], values["memory_limit"], values["nanny"]) == (8, "0.5", True)
    args = build_parser().parse_args(["--scheduler", "tcp://a:1", "--nthreads", "2", "--nthreads=8", "--nanny",
                                      "--no-nanny", "--lifetime", "1h", "--lifetime", "55m"])
    assert (args.nthreads, args.nanny, args.lifetime) == (8, False, 3300.0)


def test_the_table_is_pure():
    from unit.test_layering import PACKAGE, impurities
    assert impurities(PACKAGE / "worker" / "flags.py") == []


# -- values, as dask reads them --------------------------------------------------------------

def test_durations_read_as_dask_reads_them():
    from dask.utils import parse_timedelta
    for text in ["55m", "4m", "4 minutes", "1h", "90s", "90", "300ms", "1.5h", "2d", "1w", "10 Seconds", "1e3", "0"]:
        assert parse_duration(text) == pytest.approx(parse_timedelta(text)), text


def test_byte_sizes_read_as_dask_reads_them():
    from dask.utils import parse_bytes as dask_parse_bytes
    for text in ["4GB", "6.52GiB", "5000M", "1e9", "5 kB", "1kiB", "MB", "100", "2TB", "1.5 GiB", "1.86GiB", "7g"]:
        assert parse_bytes(text) == dask_parse_bytes(text), text


def test_memory_limits_mean_what_dask_worker_makes_of_them(monkeypatch):
    import logging

    from distributed import worker_memory
    node = 64 * 2**30
    monkeypatch.setattr(worker_memory.system, "MEMORY_LIMIT", node)
    for text in ["auto", "0.5", "1", "4GB", "6.52GiB", "1e9", "2000000000", "100TB", "0"]:
        ours, note = memory_limit_bytes(text, nthreads=4, cpus=16, system_memory=node)
        theirs = worker_memory.parse_memory_limit(text, 4, total_cores=16, logger=logging.getLogger("t"))
        assert ours == (theirs or 0), text
        assert (note is not None) == (text == "100TB")


def test_lifetime_draws_port_shares_and_dropping_flags():
    assert draw_lifetime(3300, 240, 0.0) == 3060 and draw_lifetime(3300, 240, 0.5) == 3300
    assert draw_lifetime(3300, 240, 0.999999) == pytest.approx(3540, abs=0.01)
    assert draw_lifetime(3300, None, 0.9) == 3300 and draw_lifetime(None, 240, 0.5) is None
    assert draw_lifetime(0, 240, 0.5) is None                              # dask: 0 is no lifetime
    assert port_shares("3000:3026", 4) == ["3000:3005", "3006:3011", "3012:3017", "3018:3026"]
    assert port_shares("3000:3001", 2) == ["3000", "3001"] and port_shares("0", 2) == ["0", "0"]
    assert drop_flags(["--nprocs", "3", "--name", "x", "--nworkers=2", "--nanny", "--lifetime", "5m"],
                      "--nworkers", "--nanny") == ["--name", "x", "--lifetime", "5m"]
    assert ignored_worker_args(["--dashboard-address", ":0", "--nthreads", "2"]) == [
        "--dashboard-address: workers serve no dashboard (the scheduler's process does: cluster.dashboard_link): "
        "ignored"]


# -- the worker's parser agrees with the table --------------------------------------------------

BASE = ["--scheduler", "tcp://127.0.0.1:1"]


def parses(args) -> tuple[bool, str]:
    """Does the worker's own parser take these arguments? (and what it said if not)"""
    import contextlib
    import io
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            build_parser().parse_args(BASE + args)
        return True, ""
    except SystemExit:
        return False, err.getvalue()


@pytest.mark.parametrize("name", [n for n, _ in every_name() if n not in ("--scheduler", "--cluster-file")])
def test_the_worker_parser_and_the_check_agree_on_every_flag(name):
    flag = BY_NAME[name]
    given = NEEDS.get(name, []) + ([name] if not flag.takes_value else [name, GOOD.get(name, ("x",))[0]])
    accepted, said = parses(given)
    assert accepted == (check_worker_args(BASE + given) == []) == (flag.kind != REFUSED)
    if flag.kind == REFUSED:                            # in the table's words, not "unrecognized arguments"
        assert f"{name} is not supported" in said and ADVICE[name] in said
    else:
        assert getattr(build_parser().parse_args(BASE + given), flag.setting) == (
            GOOD[name][1] if flag.takes_value else flag.const)


@pytest.mark.parametrize("name,value,says", BAD)
def test_the_worker_parser_refuses_bad_values_with_the_same_advice(name, value, says):
    accepted, said = parses([name, value])
    assert not accepted and says in said


def test_the_parser_takes_no_abbreviations_the_check_would_refuse():
    assert not parses(["--life", "5m"])[0] and check_worker_args(["--life", "5m"])


# -- real workers ----------------------------------------------------------------------------------

def start(cluster, tmp_path, name, *flags, job_walltime=None):
    """A worker command as a job runs it; with `job_walltime`, inside a job that starts now."""
    env = _child_env(cluster.secret)
    if job_walltime is not None:
        env.update(HPC_CLUSTER_JOB_START=f"{time.time():.3f}", HPC_CLUSTER_JOB_WALLTIME=str(job_walltime))
    log = open(tmp_path / f"{name}.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", "hpc_cluster.worker", "--scheduler", cluster.scheduler_address,
                             "--name", name, *flags], env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    log.close()
    return proc


def stop(proc) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()


def workers_named(client, prefix) -> dict[str, dict]:
    return {a: w for a, w in client.scheduler_info()["workers"].items() if w["name"].startswith(prefix)}


def joined(client, prefix, n=1, timeout=30) -> dict[str, dict]:
    found = wait_until(lambda: len(workers_named(client, prefix)) >= n and workers_named(client, prefix),
                       timeout=timeout, what=f"{n} worker(s) named {prefix}*")
    for w in found.values():
        assert w.get("lifetime_end") is not None, (
            "the scheduler did not keep the worker's lifetime_end: scheduler/links.py _serve_worker must copy it "
            f"from the registration into the worker's info; got {sorted(w)}")
    return found


def death_of(client, address) -> dict:
    return wait_until(lambda: next((d for d in client.deaths() if d["worker"] == address), None),
                      timeout=30, what=f"the death record of {address}")


def why(client, future) -> dict:
    return client._lt.run(client._request({"op": "why", "key": future.key}), 30)


def test_a_worker_is_drained_and_retired_before_its_lifetime_ends(tmp_path):
    # In a 20 s job, a 12 s lifetime is the earlier deadline. The drain starts at most 4 s
    # (20 % of the walltime) before it: a task running until 1.5 s before the end is executing
    # when the drain starts, and may finish (it was started with time left); then the worker goes.
    with LocalCluster(n_workers=1, threads_per_worker=1) as cluster, Client(cluster) as client:
        proc = start(cluster, tmp_path, "life", "--nthreads", "1", "--resources", "LIFE=1", "--lifetime", "12s",
                     job_walltime=20)
        try:
            [(addr, info)] = joined(client, "life").items()
            assert info["lifetime"] == 12.0 and info["lifetime_end"] < info["job_start"] + 20
            task_end = info["lifetime_end"] - 1.5
            running = client.submit(slow, "kept", task_end - time.time(), resources={"LIFE": 1})
            too_long = client.submit(slow, "never here", 0.1, resources={"LIFE": 1}, duration=30, pure=False)
            gone = death_of(client, addr)
            assert proc.wait(30) == 0                                      # the nanny ended with it: the job ends
        finally:
            stop(proc)
        assert gone["cause"] == "retired" and not gone["blame"]
        assert task_end < gone["time"] < info["lifetime_end"]             # after its task, before its lifetime
        assert running.result(30) == "kept"                                # copied to the other worker first
        assert why(client, running)["attempts"] == []                      # nothing charged
        assert why(client, too_long)["state"] != "processing" and why(client, too_long)["attempts"] == []
        final = wait_until(lambda: [d for d in client.deaths() if d["worker"] == addr and d["final_at"]],
                           what="the verdict made final by the nanny's report")[0]
        assert final["cause"] == "retired"


def test_lifetime_restart_gives_the_nanny_a_fresh_worker_in_the_same_job(tmp_path):
    with LocalCluster(n_workers=0) as cluster, Client(cluster) as client:
        nanny = start(cluster, tmp_path, "again", "--lifetime", "5s", "--lifetime-restart", job_walltime=15)
        try:
            [(first, info)] = joined(client, "again").items()
            gone = death_of(client, first)
            later = wait_until(lambda: {a: w for a, w in workers_named(client, "again").items() if a != first},
                               timeout=30, what="a fresh worker from the same nanny")
            fresh = next(iter(later.values()))
            assert fresh["nanny_id"] == info["nanny_id"] and fresh["pid"] != info["pid"]
            assert fresh["lifetime_end"] > info["lifetime_end"]            # a new lifetime, from its start
            assert nanny.poll() is None                                    # the job goes on
            final = wait_until(lambda: [d for d in client.deaths() if d["worker"] == first and d["final_at"]],
                               what="the first worker's final verdict")[0]
        finally:
            code = stop(nanny)
        assert gone["cause"] == final["cause"] == "retired" and not final["blame"]
        assert code == 0


def test_restart_sees_a_worker_on_a_fixed_port_come_back(tmp_path):
    """client.restart() waited for each nanny's worker to register at a *new* address: one on a
    fixed --worker-port comes back at the same one, and restart timed out though it was back (a
    worker on a free port can be given its predecessor's port too: seen once in CI)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with LocalCluster(n_workers=0) as cluster, Client(cluster) as client:
        nanny = start(cluster, tmp_path, "fixed", "--worker-port", str(port))
        try:
            [(addr, info)] = wait_until(lambda: workers_named(client, "fixed"), timeout=30,
                                        what="the worker on the fixed port").items()
            assert addr.endswith(f":{port}")
            client.restart(timeout=30)
            [(again, fresh)] = workers_named(client, "fixed").items()
            assert again == addr and fresh["pid"] != info["pid"] and fresh["nanny_id"] == info["nanny_id"]
        finally:
            stop(nanny)


def test_a_short_lifetime_is_not_drained_from_its_start(tmp_path):
    # No job here, so no walltime caps the drain margin (60 s): were the lifetime not to cap it
    # too, a 10 s worker would be drained as soon as it joined, and restarted at once, again and again.
    with LocalCluster(n_workers=0) as cluster, Client(cluster) as client:
        nanny = start(cluster, tmp_path, "short", "--lifetime", "10s", "--lifetime-restart")
        try:
            [(addr, info)] = joined(client, "short").items()
            gone = death_of(client, addr)
        finally:
            stop(nanny)
        lived = gone["time"] - (info["lifetime_end"] - info["lifetime"])
        assert 5 < lived < 10, (f"a 10 s lifetime was retired after {lived:.1f} s: the drain margin "
                                "(scheduler/state/drain.py drain_margin) must be capped by the lifetime as by the walltime")


def test_each_worker_of_a_job_draws_its_own_lifetime(tmp_path):
    # Two processes of one job (--nworkers 2), 60 s +/- 20 s each, in a 100 s job.
    with LocalCluster(n_workers=0) as cluster, Client(cluster) as client:
        before = time.time()
        job = start(cluster, tmp_path, "stag", "--nworkers", "2", "--lifetime", "60", "--lifetime-stagger", "20",
                    job_walltime=100)
        try:
            workers = joined(client, "stag", n=2)
            lifetimes = sorted(w["lifetime"] for w in workers.values())
            assert all(40 <= t <= 80 for t in lifetimes) and lifetimes[0] != lifetimes[1]
            for w in workers.values():
                assert before <= w["lifetime_end"] - w["lifetime"] <= time.time()   # counted from its start
        finally:
            assert stop(job) == 0


def test_ports_pid_file_threads_and_memory_limit_as_dask_means_them(tmp_path):
    base = random.randrange(20000, 60000, 20)
    pid_file = tmp_path / "job.pid"
    with LocalCluster(n_workers=0) as cluster, Client(cluster) as client:
        job = start(cluster, tmp_path, "flagged", "--nworkers", "2", "--worker-port", f"{base}:{base + 19}",
                    "--pid-file", str(pid_file), "--nthreads", "0", "--memory-limit", "0.5",
                    "--dashboard-address", ":8787", "--protocol", "tcp")
        try:
            workers = wait_until(lambda: len(workers_named(client, "flagged")) == 2
                                 and workers_named(client, "flagged"), what="both workers")
            assert pid_file.read_text() == str(job.pid)
            ports = {w["name"]: int(a.rsplit(":", 1)[1]) for a, w in workers.items()}
            assert base <= ports["flagged-0"] < base + 10 <= ports["flagged-1"] < base + 20
            for w in workers.values():
                assert w["nthreads"] == max(1, cpu_count() // 2)
                assert w["memory_limit"] == int(0.5 * system_memory())
        finally:
            assert stop(job) == 0
        assert not pid_file.exists()
        assert "--dashboard-address: workers serve no dashboard" in (tmp_path / "flagged.log").read_text()


def test_a_worker_command_with_an_unsupported_flag_stops_with_advice():
    out = subprocess.run([sys.executable, "-m", "hpc_cluster.worker", "--scheduler", "tcp://127.0.0.1:1",
                          "--preload", "mysetup", "--lifetime", "55m", "--lifetme-stagger", "4m"],
                         capture_output=True, text=True, timeout=60, env=_child_env(b"s" * 32))
    assert out.returncode == 2
    assert "--preload is not supported" in out.stderr and "job_script_prologue" in out.stderr
    assert "did you mean --lifetime-stagger?" in out.stderr
    assert "unrecognized arguments" not in out.stderr
