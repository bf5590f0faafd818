"""The search space: grid or seeded sample, checked values, train flags."""

from __future__ import annotations

import pytest

from vaecf.errors import VaecfError
from vaecf.tuning.space import DEFAULT_SPACE, load_space, train_flags, trials
from vaecf.tuning.trials import mark_best


def test_a_small_grid_is_taken_whole_in_order() -> None:
    space = {"beta_cap": [0.1, 0.2], "anneal_steps": [None, 0]}
    assert trials(space, 10, seed=1) == [
        {"beta_cap": 0.1, "anneal_steps": None}, {"beta_cap": 0.1, "anneal_steps": 0},
        {"beta_cap": 0.2, "anneal_steps": None}, {"beta_cap": 0.2, "anneal_steps": 0}]


def test_a_large_grid_is_sampled_without_repeats_by_the_seed() -> None:
    first = trials(DEFAULT_SPACE, 6, seed=3)  # 3 * 2 * 3 * 2 * 2 = 72 grid points
    assert first == trials(DEFAULT_SPACE, 6, seed=3) and first != trials(DEFAULT_SPACE, 6, 4)
    assert len({tuple(t.values()) for t in first}) == 6
    assert all(t["beta_cap"] in DEFAULT_SPACE["beta_cap"] for t in first)


def test_train_flags_skip_a_null_anneal_schedule() -> None:
    assert train_flags({"beta_cap": 0.3, "anneal_steps": None, "epochs": 20}) == [
        "--beta-cap", "0.3", "--epochs", "20"]


@pytest.mark.parametrize(("text", "message"), [
    ('{"epochs": [0]}', "epochs 0: expected an integer >= 1"),
    ('{"epochs": [2.5]}', "epochs 2.5: expected an integer >= 1"),
    ('{"beta_cap": []}', "beta_cap: expected a non-empty list"),
    ('{"learning_rate": [true]}', "learning_rate True: expected a number"),
    ("[]", "expected a JSON object")])
def test_bad_spaces_are_refused(text: str, message: str) -> None:
    with pytest.raises(VaecfError, match=message):
        load_space(text, "--space")


def test_the_best_is_the_highest_validation_ndcg_first_of_equals() -> None:
    records = [{"trial": i, "val": {"ndcg_at_100": v}} for i, v in enumerate([0.2, 0.3, 0.3])]
    assert mark_best(records)["trial"] == 1
    assert [r["best"] for r in records] == [False, True, False]
