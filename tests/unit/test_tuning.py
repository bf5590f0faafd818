"""The search space: grid or seeded sample, checked values, train flags."""

from __future__ import annotations

import numpy as np
import pytest

from vaecf.errors import VaecfError
from vaecf.tuning.space import DEFAULT_SPACE, load_space, search, train_flags, trials
from vaecf.tuning.trials import best_of, choose


def test_a_small_grid_is_taken_whole_in_order() -> None:
    space = {"beta_cap": [0.1, 0.2], "anneal_steps": [None, 0]}
    assert trials(space, 10, seed=1) == [
        {"beta_cap": 0.1, "anneal_steps": None}, {"beta_cap": 0.1, "anneal_steps": 0},
        {"beta_cap": 0.2, "anneal_steps": None}, {"beta_cap": 0.2, "anneal_steps": 0}]


def test_a_large_grid_is_sampled_without_repeats_by_the_seed() -> None:
    space = {**DEFAULT_SPACE, "beta_cap": [0.1, 0.2, 0.4], "epochs": [20, 50]}  # 24 points
    first = trials(space, 6, seed=3)
    assert first == trials(space, 6, seed=3) and first != trials(space, 6, 4)
    assert len({tuple(t.values()) for t in first}) == 6
    assert all(t["beta_cap"] in space["beta_cap"] for t in first)


def test_the_default_space_is_the_grid_the_default_trials_take_whole() -> None:
    grid = trials(DEFAULT_SPACE, 8, seed=0)
    assert len(grid) == 8 == len({tuple(t.values()) for t in grid})
    assert grid == trials(DEFAULT_SPACE, 8, seed=1)  # a whole grid: no sample, no seed


def test_the_search_starts_with_train_defaults_whatever_the_sample() -> None:
    from vaecf.train.config import TrainConfig

    grid = search(DEFAULT_SPACE, 8, seed=0)
    reference = {"hidden": TrainConfig.hidden, "learning_rate": TrainConfig.learning_rate,
                 "kl_per_item": TrainConfig.kl_per_item}
    assert grid[0] == reference and len(grid) == 8 == len({tuple(t.values()) for t in grid})
    assert sorted(map(str, grid)) == sorted(map(str, trials(DEFAULT_SPACE, 8, seed=0)))
    # a sample of a grid that may not hold the defaults: still first, and counted
    space = {"beta_cap": [0.1, 0.3, 0.4], "dropout": [0.1, 0.3], "epochs": [None, 20, 50]}
    for seed in range(4):
        drawn = search(space, 3, seed=seed)
        assert drawn[0] == {"beta_cap": 0.2, "dropout": 0.5, "epochs": None}
        assert len(drawn) == 3 and drawn[0] not in drawn[1:]


def records_of(*ndcgs: float) -> list[dict]:
    return [{"trial": i, "val": {"ndcg_at_100": v}, "val_stderr": {"ndcg_at_100": 0.001},
             "params": {}} for i, v in enumerate(ndcgs)]


def test_the_best_replaces_train_defaults_only_beyond_the_paired_standard_error() -> None:
    # per-user validation NDCG@100 of 4 users; trial 2 is the best by its mean
    users = {0: np.array([0.30, 0.10, 0.50, 0.20]), 1: np.array([0.29, 0.10, 0.49, 0.20]),
             2: np.array([0.60, 0.00, 0.50, 0.02])}  # +0.005 on average, but noisy
    records = records_of(0.275, 0.27, 0.28)
    chosen, decision = choose(records, lambda r: users[r["trial"]])
    assert chosen["trial"] == 0 and [r["best"] for r in records] == [True, False, False]
    assert decision["candidate"] == 2 and decision["chosen"] == 0
    assert decision["paired"]["delta"] == pytest.approx(0.005)
    assert decision["paired"]["stderr"] > 0.005
    users[2] = users[0] + np.array([0.01, 0.02, 0.01, 0.02])  # a steady lead: it replaces
    chosen, decision = choose(records, lambda r: users[r["trial"]])
    assert chosen["trial"] == 2 == decision["chosen"] and records[2]["best"]
    records = records_of(0.30, 0.29)  # the defaults are the best: nothing to compare
    chosen, decision = choose(records, lambda r: 1 / 0)
    assert chosen["trial"] == 0 and decision["paired"] is None


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
    assert best_of(records)["trial"] == 1


def test_train_flags_and_descriptions_of_the_options() -> None:
    from vaecf.tuning.space import describe

    trial = load_space('{"composite_prior": [true, false], "kl_per_item": [null, 0.005], '
                       '"alternate": [3], "anneal_steps": [null]}', "--space")
    first, last = trials(trial, 4, seed=0)[0], trials(trial, 4, seed=0)[-1]
    assert train_flags(first) == ["--composite-prior", "--alternate", "3"]
    assert train_flags(last) == ["--kl-per-item", "0.005", "--alternate", "3"]
    assert describe(first) == ("composite_prior=true, kl_per_item=null, alternate=3, "
                               "anneal_steps=null")
    with pytest.raises(VaecfError, match="composite_prior 1: expected true or false"):
        load_space('{"composite_prior": [1]}', "--space")


def record(trial: int, ndcg: float, stderr: float | None, **params: object) -> dict:
    return {"trial": trial, "val": {"ndcg_at_100": ndcg},
            "val_stderr": {"ndcg_at_100": stderr}, "params": {"epochs": 50} | params}


def test_a_lead_within_one_standard_error_goes_to_the_simpler_trial() -> None:
    records = [record(0, 0.300, 0.01, composite_prior=True),
               record(1, 0.295, 0.01),  # within noise of trial 0 and simpler: chosen
               record(2, 0.285, 0.01, epochs=20),  # simpler still, but not within noise
               record(3, 0.296, 0.01, alternate=3)]
    assert best_of(records)["trial"] == 1
    records[0]["val"]["ndcg_at_100"] = 0.320  # a lead beyond noise keeps the complex trial
    assert best_of(records)["trial"] == 0
    records = [record(0, 0.300, None, alternate=3), record(1, 0.299, None)]
    assert best_of(records)["trial"] == 0  # no standard error recorded: the highest


def test_with_per_user_scores_within_noise_means_the_paired_standard_error() -> None:
    """Trial 1 is simpler and 0.005 below trial 0, within trial 0's own standard error (0.01)
    but steadily below it on every user: the paired error says the lead is real."""
    records = [record(0, 0.300, 0.01, composite_prior=True), record(1, 0.295, 0.01)]
    assert best_of(records)["trial"] == 1  # no per-user scores: the unpaired error
    base = np.linspace(0.1, 0.5, 40)
    steady = {0: base + 0.005, 1: base + np.where(np.arange(40) % 2, 0.001, -0.001)}
    assert best_of(records, lambda r: steady[r["trial"]])["trial"] == 0
    noisy = {0: base + 0.005, 1: base + np.where(np.arange(40) % 2, 0.05, -0.05)}
    assert best_of(records, lambda r: noisy[r["trial"]])["trial"] == 1


def test_the_kl_weight_of_the_kept_epoch() -> None:
    from vaecf.tuning.trials import beta_at_best_epoch

    manifest = {"parameters": {"beta_cap": 0.2, "anneal_steps": 999, "kl_per_item": None},
                "counts": {"epochs": 100, "steps": 1000}, "best_epoch": 19}
    assert beta_at_best_epoch(manifest) == pytest.approx(189 / 999)  # a fifth of the cap
    manifest["best_epoch"] = 100
    assert beta_at_best_epoch(manifest) == 0.2
    manifest["parameters"]["anneal_steps"] = 0
    manifest["best_epoch"] = 1
    assert beta_at_best_epoch(manifest) == 0.2
    manifest["parameters"]["kl_per_item"] = 0.005
    assert beta_at_best_epoch(manifest) is None


@pytest.mark.parametrize("stop", [VaecfError("stopped by SIGINT after epoch 2 (step 8); rerun "
                                             "to resume from its checkpoint"),
                                  KeyboardInterrupt()])
def test_a_tune_stopped_in_a_trial_says_nothing_is_kept(tmp_path, monkeypatch, stop) -> None:
    import vaecf.train.run
    from vaecf.tuning.local import run_trials

    def train(config) -> None:
        raise stop

    monkeypatch.setattr(vaecf.train.run, "train", train)
    with pytest.raises(VaecfError) as raised:
        run_trials("split", tmp_path / "trials", tmp_path / "scratch", [{"hidden": 8}], {})
    assert str(raised.value).startswith("stopped by SIGINT")
    assert "in trial 0;" in str(raised.value) and "are not kept" in str(raised.value)
    assert "rerun to resume" not in str(raised.value)
