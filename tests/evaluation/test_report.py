"""Evaluation arithmetic: the paper's TextCraft 74.31 from Table 1's tier rates; sample std; summaries."""

import pytest

from sera_jax.evaluation.report import Outcome, aggregate, markdown_table, mean_std, summarise


def test_paper_textcraft_overall_from_tier_rates():
    overall = aggregate([99.09, 97.81, 78.92, 6.13], [147, 213, 136, 136])
    assert round(overall, 2) == 74.31
    assert abs(overall - 74.314) < 5e-4
    # and it is not the plain mean of the tier rates
    assert abs(overall - sum([99.09, 97.81, 78.92, 6.13]) / 4) > 3


def test_sample_std():
    m, s = mean_std([74.31 - 0.9, 74.31, 74.31 + 0.9])
    assert m == pytest.approx(74.31) and s == pytest.approx(0.9)
    assert mean_std([5.0]) == (5.0, 0.0)
    with pytest.raises(ValueError):
        mean_std([])


def test_summarise_counts_errors_as_failures():
    outs = [Outcome("a", "easy", True), Outcome("b", "easy", None), Outcome("c", "hard", False),
            Outcome("d", "hard", True), Outcome("e", "hard", True)]
    t = summarise(outs, ["easy", "medium", "hard"])
    assert list(t) == ["easy", "hard", "overall"]
    assert t["easy"]["rate"] == 50.0 and t["easy"]["errored"] == 1
    assert t["overall"]["rate"] == pytest.approx(60.0) and t["overall"]["scheduled"] == 5
    md = markdown_table([t, t])
    assert "| easy (2) |" in md and "50.00 ± 0.00" in md


def test_bad_aggregate_input():
    with pytest.raises(ValueError):
        aggregate([1.0], [1, 2])
    with pytest.raises(ValueError):
        aggregate([1.0], [0])
