"""``vaecf tune`` on a planted split: local trials, the KFP fan-in mode, the report's trials."""

from __future__ import annotations

import contextlib
import io
import json
from functools import partial
from pathlib import Path

import pytest
import stage_checks

from vaecf.io import read_manifest

SPACE = {"beta_cap": [0.0, 0.3], "learning_rate": [0.003], "dropout": [0.5],
         "hidden": [32], "latent": [8], "epochs": [2, 3]}
assert_failed = partial(stage_checks.assert_failed, "tune")
# the module's fixture trains 3 trials (63 s of the first test's setup at a load of 15)
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tuned_run(synthetic_split, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """(split, tune output, its log): 3 of the space's 4 grid points, drawn with seed 5."""
    from vaecf.cli import main

    split = synthetic_split(n_users=600, n_items=300, seed=0)
    out = tmp_path_factory.mktemp("tune") / "tuned"
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        code = main(["tune", "--split", str(split), "--output", str(out), "--space",
                     json.dumps(SPACE), "--trials", "3", "--seed", "5", "--batch-size", "100",
                     "--max-epochs", "3", "--baselines", "popularity"])
    assert code == 0
    return split, out, printed.getvalue()


@pytest.fixture()
def tuned(tuned_run):  # type: ignore[no-untyped-def]
    return tuned_run[:2]


def candidate(records: list[dict]) -> dict:
    """The rule, restated: the highest val NDCG@100 unless a trial within its standard error
    is simpler (here, the space varies only the epochs among options of simplicity; trial 0
    stops early, its epochs null, counted as 0), then the widest layers last."""
    top = max(records, key=lambda r: r["val"]["ndcg_at_100"])
    close = [r for r in records if r["val"]["ndcg_at_100"]
             >= top["val"]["ndcg_at_100"] - top["val_stderr"]["ndcg_at_100"]]
    return min(close, key=lambda r: (r["params"]["epochs"] or 0, r["params"]["hidden"],
                                     -r["val"]["ndcg_at_100"]))


def chosen(records: list[dict], choice: dict) -> dict:
    """Trial 0 (train's defaults) unless the candidate leads it by more than the paired
    standard error on the validation users (recorded in the tune's manifest)."""
    best = candidate(records)
    assert choice["candidate"] == best["trial"] and choice["reference"] == 0
    if best["trial"] == 0:
        assert choice["paired"] is None
        return best
    paired = choice["paired"]
    assert paired["users"] > 0 and paired["stderr"] > 0
    return best if paired["delta"] > paired["stderr"] else records[0]


def read_trials(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "trials.jsonl").read_text().splitlines()]


def test_every_trial_is_recorded_and_only_the_best_is_tested(tuned) -> None:
    from vaecf.tuning.space import search

    _, out = tuned
    records = read_trials(out)
    expected = search(SPACE, 3, 5)
    assert len(records) == 3 and [r["trial"] for r in records] == [0, 1, 2]
    for entry, trial in zip(records, expected, strict=True):
        model = read_manifest(out / entry["model"], "train")
        assert {k: entry["params"][k] for k in trial} == trial  # what was searched
        assert entry["params"]["anneal_steps"] == model["parameters"]["anneal_steps"]
        # the exported model's validation metrics: with EASE blended in, where it was tried
        exported = model["ease_blend"]
        assert entry["val"] == exported["val"] and entry["best_epoch"] == model["best_epoch"]
        assert entry["val_stderr"] == exported["val_stderr"]
        assert 0.0 < entry["val_stderr"]["ndcg_at_100"] < 0.1
        epochs = trial["epochs"] or 3  # trial 0, train's defaults: stops early, at most 3
        assert entry["epochs"] == epochs and 1 <= entry["best_epoch"] <= epochs
    from vaecf.train.config import TrainConfig

    assert records[0]["params"]["hidden"] == TrainConfig.hidden  # trial 0: train's defaults
    assert records[0]["params"]["epochs"] is None
    best = chosen(records, read_manifest(out, "tune")["choice"])
    assert [r["best"] for r in records] == [r is best for r in records]
    metrics = json.loads((out / "test" / "metrics.json").read_text())
    # named where the model is published, not the staging folder it was read from
    assert metrics["subset"] == "test" and metrics["model"] == f"{out}/{best['model']}"
    evaluated = read_manifest(out / "test", "evaluate")
    assert evaluated["inputs"]["model"] == f"{out}/{best['model']}"
    assert (out / best["model"] / "saved_model").is_dir()
    assert set(metrics["baselines"]) == {"popularity"}
    manifest = read_manifest(out, "tune")
    assert manifest["best"]["trial"] == best["trial"] == manifest["choice"]["chosen"]
    assert manifest["parameters"]["rule"].startswith("trial 0 (train's defaults) is kept")
    assert manifest["test"]["ndcg_at_100"] == metrics["ndcg_at_100"]
    assert not any(p.name.startswith("scratch") for p in out.parent.iterdir())


def test_the_log_numbers_trials_from_0_writes_null_and_prints_the_baselines(tuned_run
                                                                            ) -> None:
    _, out, printed = tuned_run
    best = next(r for r in read_trials(out) if r["best"])
    assert "tune: trial 0 of trials 0-2 (trial-000)" in printed
    assert "tune: trial 2 of trials 0-2 (trial-002)" in printed and "3/3" not in printed
    assert "anneal_steps" not in printed or "None" not in printed
    assert "trial 0 (train's defaults) is kept unless the best trial" in printed
    assert f"tune: trial {best['trial']} on the test users: ndcg_at_100 " in printed
    assert "tune: popularity on the same users: ndcg_at_100 " in printed
    assert "(paired z " in printed and "--batch-users" not in printed
    assert ".tune.staging" not in printed.split("evaluating it on the test users")[1]
    assert "kept epoch" in printed and "of beta_cap 0.2" in printed


def test_the_kfp_fan_in_picks_the_same_best_from_val_evaluations(tuned, cli, tmp_path: Path  # type: ignore[no-untyped-def]
                                                                  ) -> None:
    split, out = tuned
    records = read_trials(out)
    models = [str(out / r["model"]) for r in records]
    evaluations = []
    for index, model in enumerate(models):
        target = tmp_path / f"val-{index}"
        code, _, err = cli("evaluate", "--split", split, "--model", model, "--subset", "val",
                           "--output", target)
        assert code == 0, err
        evaluations.append(str(target))
    code, _, err = cli("tune", "--split", split, "--output", tmp_path / "fan-in",
                       "--collect-models", *models,  # evaluations paired by the model they name
                       "--collect-evaluations", *reversed(evaluations), "--baselines")
    assert code == 0, err
    collected = read_trials(tmp_path / "fan-in")
    assert [r["best"] for r in collected] == [r["best"] for r in records]
    for mine, local in zip(collected, records, strict=True):
        assert mine["params"] == local["params"]  # read back from each model's manifest
        for key, value in local["val"].items():  # the SavedModel vs the trainer's weights
            assert mine["val"][key] == pytest.approx(value, abs=1e-5)


def test_report_shows_every_trial(tuned, cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    split, out = tuned
    code, _, err = cli("report", "--output", tmp_path / "report", "--trials",
                       out / "trials.jsonl", "--metrics", out / "test" / "metrics.json",
                       "--manifests", split, out)
    assert code == 0, err
    data = json.loads((tmp_path / "report" / "report.json").read_text())
    # anneal_steps varies too: train resolves its default from the epochs and the cap
    assert data["tuning"]["searched"] == ["anneal_steps", "beta_cap", "epochs", "hidden",
                                          "latent", "learning_rate"]
    assert len(data["tuning"]["trials"]) == 3
    markdown = (tmp_path / "report" / "report.md").read_text()
    best = next(r for r in read_trials(out) if r["best"])
    assert f"| {best['trial']} (best) |" in markdown
    assert "Tuning: the chosen of 3 trials is trial" in markdown
    assert markdown.count("data:image/png") == 0  # plots go to the HTML only
    assert "Validation NDCG@100 of every trial" in (tmp_path / "report" / "report.html"
                                                    ).read_text()


@pytest.mark.parametrize(("flags", "message"), [
    (["--space", '{"momentum": [0.9]}'], "--space: unknown hyperparameter 'momentum'"),
    (["--space", '{"dropout": [1.5]}'], "--space: dropout 1.5: expected a number >= 0 and < 1"),
    (["--trials", "0"], "--trials 0: expected 1..10000"),
    (["--collect-models", "a", "b", "--collect-evaluations", "c"],
     "--collect-models (2) and --collect-evaluations (1) must pair up one to one")])
def test_bad_flags_fail_with_one_line(synthetic_split, cli, tmp_path: Path, flags: list[str],  # type: ignore[no-untyped-def]
                                      message: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for name in ("a", "b", "c"):  # the --collect-* folders exist: the pairing is what is wrong
        (tmp_path / name).mkdir()
    result = cli("tune", "--split", synthetic_split(n_users=600, n_items=300, seed=0),
                 "--output", tmp_path / "out", *flags)
    assert_failed(result, tmp_path / "out", message)
