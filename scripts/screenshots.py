"""Real screenshots of the dashboard for the README and docs/dashboard.md (scripts/screenshots).

A PBSCluster on the test suite's command-level PBS simulator (tests/helpers/pbs_sim: qsub/qstat/qdel
with real worker processes in the simulated jobs), so the jobs page has batch jobs, one of
them held; a workload with two task prefixes and an erring one; one worker that the nanny
stops over its memory budget. Then headless Chromium (tests/helpers/browser.py) takes a picture of
each page. Everything runs on this machine, in a temporary directory.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from helpers.browser import colour_summary, ensure_chromium, screenshot  # noqa: E402
from helpers.wait import wait_until  # noqa: E402


def slowinc(x, delay=0.4):
    import time
    time.sleep(delay)
    return x + 1


def load_part(i):
    import time
    time.sleep(0.25)
    return b"x" * (2 * 2**20)          # touched pages: resident memory, as real data is


def grow(step, steps, pause):
    """Memory that grows by `step` bytes every `pause` seconds: the nanny's 10 Hz samples see
    it pass its terminate level before the job's limit (a memory-nanny death, charted)."""
    import time
    held = []
    for _ in range(steps):
        held.append(b"x" * step)
        time.sleep(pause)
    return sum(map(len, held))


def check(x):
    if x % 7 == 3:
        raise ValueError(f"bad record {x}")
    return x


def isolate(tmp: Path) -> None:
    """The simulator on PATH; our cluster files, config and jobs' homes under `tmp`."""
    sim = REPO / "tests" / "helpers" / "pbs_sim"
    (tmp / "home").mkdir()
    (tmp / "pbs").mkdir()
    os.environ.update({"PBS_SIM_HOME": str(tmp / "pbs"), "PBS_SIM_KILL_DELAY": "1", "HOME": str(tmp / "home"),
                       "XDG_CONFIG_HOME": str(tmp / "xdg"), "HPC_CLUSTER_SYSTEM_CONFIG_DIR": str(tmp / "etc"),
                       "DASK_CONFIG": str(tmp / "dask"), "PATH": f"{sim / 'bin'}{os.pathsep}{os.environ['PATH']}"})
    for var in ("HPC_CLUSTER_CONFIG", "HPC_CLUSTER_SITE", "PBS_SIM_FLAVOR"):
        os.environ.pop(var, None)
    os.chdir(tmp)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="make docs/images/dashboard-*.png")
    p.add_argument("--out", default=str(REPO / "docs" / "images"), help="where the PNGs go (default docs/images)")
    args = p.parse_args(argv)
    browser = ensure_chromium()
    if browser is None:
        raise SystemExit("screenshots: no chromium; install Debian's `chromium` package (as root)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="hpc-cluster-screenshots-") as tmp:
        isolate(Path(tmp))                  # before dask and our package load: they read the environment
        from helpers.dashboard import MB
        from hpc_cluster import Client
        from hpc_cluster.deploy.cluster import PBSCluster
        from helpers.pbs_sim import pbssim
        try:
            with PBSCluster(cores=2, processes=1, memory="1GB", walltime="01:00:00", name="demo",
                            scheduler_options={"host": "127.0.0.1", "dashboard_address": ":0"},
                            pools={"bigmem": {"memory": "4GB", "max_jobs": 2, "job_extra_directives": ["-h"]}},
                            ) as cluster, Client(cluster) as client:
                cluster.scale(jobs=3)
                cluster.scale(jobs=1, pool="bigmem")           # held in the queue (-h): pending
                client.wait_for_workers(3, timeout=180)
                kept = client.map(slowinc, range(12), delay=0.05)
                client.gather(kept)
                time.sleep(3)                                 # some life before, on the memory chart
                # Stopped by the nanny over its 1 GB; the final verdict moves it to pool bigmem, whose
                # job is held: it waits there (the deaths page shows the escalation).
                hogged = client.submit(grow, 40 * MB, 40, 0.12, pure=False)
                wait_until(lambda: [d for d in client.deaths() if d["final_at"]], 120, "a final verdict")
                client.wait_for_workers(3, timeout=180)
                work = [client.map(load_part, range(60)), client.map(slowinc, range(300)), client.map(check, range(40))]
                time.sleep(6)                                 # let the task stream fill (the pictures' content)
                link = cluster.dashboard_link
                for page, size in (("workers", (1280, 560)), ("tasks", (1280, 640)), ("jobs", (1280, 420)),
                                   ("deaths", (1280, 900))):
                    path = screenshot(browser, f"{link}#{page}", out / f"dashboard-{page}.png", size=size)
                    colours, top = colour_summary(path)
                    print(f"{path}: {path.stat().st_size // 1024} KiB, {colours} colours", flush=True)
                del work, kept, hogged
        finally:
            pbssim.cleanup(os.environ["PBS_SIM_HOME"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
