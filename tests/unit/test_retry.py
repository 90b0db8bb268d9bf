"""retry.Backoff: the one backoff of every retry loop (issue 30, point 6)."""

import ast
import itertools
from pathlib import Path

import pytest

from hpc_cluster.retry import Backoff

PACKAGE = Path(__file__).resolve().parents[2] / "hpc_cluster"


def test_delays_grow_by_the_factor_to_the_cap_and_stay_there():
    b = Backoff(0.1, 2.0)
    assert [round(b.next(), 6) for _ in range(8)] == [0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0, 2.0]
    slow = Backoff(0.01, 0.2, factor=1.5)
    waits = list(itertools.islice(slow, 12))
    assert waits[:3] == pytest.approx([0.01, 0.015, 0.0225])
    assert max(waits) == 0.2 and waits[-1] == 0.2 and waits == sorted(waits)


def test_jitter_draws_within_the_fraction_of_the_undrawn_delay():
    assert Backoff(1.0, 8.0, jitter=0.5, rng=lambda: 0.0).next() == 0.5        # the shortest: half
    assert Backoff(1.0, 8.0, jitter=0.5, rng=lambda: 0.999999).next() == pytest.approx(1.0)
    assert Backoff(1.0, 8.0, jitter=1.0, rng=lambda: 0.0).next() == 0.0        # full jitter
    b = Backoff(0.1, 2.0, jitter=0.5)                                           # the real draw
    for _ in range(200):
        undrawn = b.peek()
        wait = b.next()
        assert undrawn / 2 <= wait <= undrawn <= 2.0


def test_jittered_waits_of_many_loops_do_not_fall_in_step():
    # What the jitter is for: 300 workers losing their scheduler at once do not all try again
    # at the same moments (worker/reattach.py).
    loops = [Backoff(0.1, 2.0, jitter=0.5) for _ in range(300)]
    third = [sum(b.next() for _ in range(3)) for b in loops]     # when each one's third try starts
    assert len({round(t, 6) for t in third}) > 290
    assert all(0.35 <= t <= 0.7 for t in third)                 # 0.1 + 0.2 + 0.4, each in [half, all]


def test_reset_starts_over_and_counts_the_streak():
    b = Backoff(0.5, 5.0)
    for _ in range(4):
        b.next()
    assert b.count == 4 and b.peek() == 5.0                  # 0.5, 1, 2, 4, then 8 capped
    assert b.reset() == 4
    assert b.count == 0 and b.next() == 0.5


@pytest.mark.parametrize("args, match", [((0, 1), "0 < first <= cap"), ((2, 1), "0 < first <= cap"),
                                         ((1, 2, 0.5), "factor >= 1"), ((1, 2, 2, 1.5), "jitter <= 1")])
def test_a_backoff_that_cannot_work_is_refused(args, match):
    with pytest.raises(ValueError, match=match):
        Backoff(*args)


def test_no_retry_loop_grows_its_own_delay():
    # Every retry loop waits through Backoff; a hand-written `delay = min(delay * 2, cap)` is
    # the drift issue 30 removed (nine copies, no jitter where it mattered).
    found = []
    for path in set(PACKAGE.rglob("*.py")) - {PACKAGE / "retry.py"}:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Assign, ast.AugAssign)):
                target = node.targets[0] if isinstance(node, ast.Assign) else node.target
                names = {n.id for n in ast.walk(node.value) if isinstance(n, ast.Name)}
                if isinstance(target, ast.Name) and "delay" in target.id and target.id in names | (
                        {target.id} if isinstance(node, ast.AugAssign) else set()):
                    found.append(f"{path.relative_to(PACKAGE)} line {node.lineno}")
    assert not found, f"use hpc_cluster.retry.Backoff: {found}"
