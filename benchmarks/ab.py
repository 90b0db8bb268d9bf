"""A/B of two commits of hpc_cluster in one run: throughput.py's map, tree and chain (and, with
`--big N`, big_graphs.py's N-task map), each commit's package in turn, alternated.

    python benchmarks/ab.py --base 3b820fc                   # HEAD's work tree against 3b820fc
    python benchmarks/ab.py --base 3b820fc --rounds 4 --big 1000000
    python benchmarks/ab.py --base HEAD~1 --head HEAD --benchmarks chain --chain 4000

The base (and, if given, the head) commit is checked out with `git worktree` under a temporary
directory; without `--head` the work tree itself is B. Each round runs A then B, the next B then A
(ABBA), so that drift in the machine's load hits both alike. The benchmark scripts are this work
tree's; only the `hpc_cluster` package differs (PYTHONPATH puts the commit's checkout first, and
LocalCluster passes its package's parent on to the processes it starts).

Printed: per figure, each side's median over the rounds, and B/A (speed: over 1 is faster; time
and CPU per task: under 1 is less). Issue 30 asks for "within 3%".
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

# (label, benchmark, key in throughput.py's result, higher is better)
FIGURES = [
    ("map tasks/s (best)", "map", "best_tasks_per_s", True),
    ("tree tasks/s (best)", "tree", "best_tasks_per_s", True),
    ("chain us/task (best)", "chain", "best_us_per_task", False),
    ("map CPU us/task", "map", ("cpu_us_per_task", "total"), False),
    ("tree CPU us/task", "tree", ("cpu_us_per_task", "total"), False),
    ("chain CPU us/task", "chain", ("cpu_us_per_task", "total"), False),
    ("map scheduler CPU s/1k tasks", "map", "scheduler_cpu_s_per_1000_tasks", False),
]
BIG_FIGURES = [("big map submit s", "submit_s", False), ("big map run s", "run_s", False),
               ("big map tasks/s", "tasks_per_s", True), ("big map B/waiting task", "rss_all_known_per_task_bytes", False)]


def checkout(rev: str, where: Path) -> Path:
    sha = subprocess.run(["git", "rev-parse", "--verify", rev + "^{commit}"], cwd=REPO, check=True,
                         capture_output=True, text=True).stdout.strip()
    path = where / sha[:12]
    subprocess.run(["git", "worktree", "add", "--detach", str(path), sha], cwd=REPO, check=True,
                   capture_output=True, text=True)
    return path


def run_side(tree: Path, argv: list[str], out: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")]))}
    subprocess.run([sys.executable, *argv, "--json", str(out)], env=env, check=True,
                   stdout=subprocess.DEVNULL, cwd=HERE)
    return json.loads(out.read_text())


def pick(result: dict, key):
    if isinstance(key, tuple):
        for k in key:
            result = (result or {}).get(k)
        return result
    return result.get(key)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", required=True, help="commit A (e.g. the commit before a refactor)")
    p.add_argument("--head", help="commit B (default: this work tree as it is)")
    p.add_argument("--rounds", type=int, default=3, help="runs of each side (default 3)")
    p.add_argument("--benchmarks", default="map,tree,chain")
    p.add_argument("--map", type=int, default=20000)
    p.add_argument("--tree", type=int, default=4096)
    p.add_argument("--chain", type=int, default=2000)
    p.add_argument("--big", type=int, default=0, metavar="N", help="also big_graphs.py's N-task map per round")
    p.add_argument("--json", metavar="PATH", help="also write every run's figures as JSON")
    args = p.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="hpc-cluster-ab-"))
    trees = {}
    try:
        trees["A"] = checkout(args.base, tmp)
        trees["B"] = checkout(args.head, tmp) if args.head else REPO
        runs = {"A": [], "B": []}
        big = {"A": [], "B": []}
        for i in range(args.rounds):
            order = ("A", "B") if i % 2 == 0 else ("B", "A")
            for side in order:
                print(f"round {i + 1}/{args.rounds}: {side} ({trees[side]})", file=sys.stderr, flush=True)
                report = run_side(trees[side], ["throughput.py", "--systems", "ours-nodash", "--repeat", "1", "--quiet",
                                                "--benchmarks", args.benchmarks, "--map", str(args.map),
                                                "--tree", str(args.tree), "--chain", str(args.chain)],
                                  tmp / f"{side}-{i}.json")
                runs[side].append(report["results"]["ours-nodash"])
                if args.big:
                    report = run_side(trees[side], ["big_graphs.py", "--systems", "ours", "--scenarios", "map",
                                                    "--tasks", str(args.big)], tmp / f"{side}-big-{i}.json")
                    big[side].append(report["results"][0] if "results" in report else report[0])
        print(f"A = {args.base}, B = {args.head or 'work tree'}; {args.rounds} rounds, ABBA; medians")
        print(f"{'figure':32s} {'A':>12s} {'B':>12s} {'B/A':>7s}  change")
        rows = [(label, [pick(r[bench], key) for r in runs["A"] if bench in r],
                 [pick(r[bench], key) for r in runs["B"] if bench in r], up) for label, bench, key, up in FIGURES]
        rows += [(label, [r.get(key) for r in big["A"]], [r.get(key) for r in big["B"]], up)
                 for label, key, up in BIG_FIGURES if args.big]
        for label, a, b, up in rows:
            a, b = [v for v in a if v is not None], [v for v in b if v is not None]
            if not a or not b:
                continue
            ma, mb = statistics.median(a), statistics.median(b)
            ratio = mb / ma if ma else float("nan")
            better = ratio - 1 if up else 1 - ratio
            print(f"{label:32s} {ma:12,.1f} {mb:12,.1f} {ratio:7.3f}  {'better' if better >= 0 else 'worse'} by "
                  f"{abs(better) * 100:.1f}%{'' if better >= -0.03 else '  (past 3%)'}")
        if args.json:
            Path(args.json).write_text(json.dumps({"base": args.base, "head": args.head, "runs": runs, "big": big},
                                                  indent=2) + "\n")
    finally:
        for side, tree in trees.items():
            if tree != REPO:
                subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=REPO, capture_output=True)
        subprocess.run(["git", "worktree", "prune"], cwd=REPO, capture_output=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
