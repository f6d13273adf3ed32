"""pyscheduler.bench.trees_ab: an A/B of two trees whose order alternates by round."""

import pytest

from pyscheduler.bench.trees_ab import order, summary


def test_the_order_alternates_and_the_position_is_told_apart_from_the_trees():
    """B 5 % faster than A, and a run 10 % faster for coming second in its round (as a capacity
    A/B measured, issue 31): a fixed order A B would say B is 15.5 % faster; alternating, the
    means say 5 % and 10 %."""
    assert [order(r) for r in range(4)] == [("A", "B"), ("B", "A"), ("A", "B"), ("B", "A")]
    runs = [(r, tree, 100.0 * (1.05 if tree == "B" else 1.0) * (1.10 if pos else 1.0))
            for r in range(6) for pos, tree in enumerate(order(r))]
    s = summary(runs)
    assert s["b_over_a"][0] == pytest.approx(1.155)  # the first round alone, A first
    assert s["ratio"] == pytest.approx(1.05)
    assert s["position"] == pytest.approx(1.10)
    assert s["A"] == pytest.approx(105.0) and s["B"] == pytest.approx(110.25)
