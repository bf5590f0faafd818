"""One convention for every stage: a wrong command line is one line on stderr, exit 1.

The flags are checked before any input is read, so these cases need no data; the relative
paths they name (inside a fresh working directory) are never created.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from vaecf.cli import STAGES
from vaecf.stages import MAX_SEED


@pytest.fixture(autouse=True)
def _in_tmp_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)


def one_line(stage: str, result: tuple[int, str, str], *expected: str) -> None:
    code, out, err = result
    assert (code, out) == (1, ""), (code, out, err)
    assert len(err.splitlines()) == 1 and err.startswith(f"vaecf {stage}: error: "), err
    for text in expected:
        assert text in err, err


@pytest.mark.parametrize("stage", list(STAGES))
def test_unknown_flag_and_missing_flags_in_every_stage(cli, stage: str) -> None:  # type: ignore[no-untyped-def]
    one_line(stage, cli(stage, "--no-such-flag"), f"(see 'vaecf {stage} --help')")
    if stage == "demo":  # the one stage whose flags all have defaults
        one_line(stage, cli(stage, "--no-such-flag"), "unrecognized arguments: --no-such-flag")
    else:
        one_line(stage, cli(stage), "the following arguments are required: --")


TRAIN = ["--split", "nowhere/split", "--output", "nowhere/model"]


@pytest.mark.parametrize(("flags", "expected"), [
    (["--batch-size", "0"], "argument --batch-size: expected a positive integer, got 0"),
    (["--epochs", "-1"], "argument --epochs: expected a positive integer, got -1"),
    (["--precision", "bogus"], "argument --precision: invalid choice: 'bogus'"),
    (["--hidden", "0"], "argument --hidden: expected a positive integer, got 0"),
    (["--anneal-steps", "-5"], "argument --anneal-steps: expected an integer >= 0, got -5"),
    (["--learning-rate", "nan"], "argument --learning-rate: expected a finite number > 0"),
    (["--learning-rate", "inf"], "argument --learning-rate: expected a finite number > 0"),
    (["--learning-rate", "0"], "argument --learning-rate: expected a finite number > 0"),
    (["--beta-cap", "-0.1"], "argument --beta-cap: expected a finite number >= 0"),
    (["--beta-cap", "nan"], "argument --beta-cap: expected a finite number >= 0"),
    (["--l2", "-0.001"], "argument --l2: expected a finite number >= 0"),
    (["--l2", "inf"], "argument --l2: expected a finite number >= 0"),
    (["--seed", "-1"], f"argument --seed: expected an integer from 0 to {MAX_SEED}, got -1"),
])
def test_train_flags(cli, flags: list[str], expected: str) -> None:  # type: ignore[no-untyped-def]
    one_line("train", cli("train", *TRAIN, *flags), expected)
    assert not Path("nowhere").exists()


@pytest.mark.parametrize(("stage", "argv"), [
    ("download", ["--dataset", "synthetic", "--output", "nowhere/raw"]),
    ("split", ["--input", "nowhere/interactions", "--output", "nowhere/split"]),
    ("train", TRAIN),
    ("benchmark", ["--output", "nowhere/benchmark"]),
    ("demo", ["--output", "nowhere/demo"]),
])
@pytest.mark.parametrize("value", ["-1", str(MAX_SEED + 1)])
def test_seed_out_of_range(cli, stage: str, argv: list[str], value: str) -> None:  # type: ignore[no-untyped-def]
    one_line(stage, cli(stage, *argv, "--seed", value),
             f"argument --seed: expected an integer from 0 to {MAX_SEED}, got {value}")
    assert not Path("nowhere").exists()


def test_no_stage_or_unknown_stage(cli) -> None:  # type: ignore[no-untyped-def]
    for argv, given in (([], "no stage given"), (["dataset"], "unknown stage 'dataset'")):
        code, out, err = cli(*argv)
        assert (code, out) == (1, "")
        assert err == f"vaecf: error: {given} (one of: {', '.join(STAGES)})\n"


# ---- numbers: every numeric flag of every stage has its bounds in one table

def test_every_numeric_flag_has_a_bound() -> None:
    """A flag added later (any stage) fails here until it has an entry in the table."""
    from vaecf.cli import build_parser
    from vaecf.io.bounds import bound, numeric_flags

    unbounded = [f"{stage} {flag}" for stage in STAGES
                 for flag, _ in numeric_flags(build_parser(stage)) if bound(stage, flag) is None]
    assert not unbounded, f"add these to vaecf.io.bounds.BOUNDS: {unbounded}"


@pytest.mark.parametrize("stage", list(STAGES))
def test_a_number_past_its_bound_is_one_line_in_every_stage(stage: str) -> None:
    import argparse

    from vaecf.cli import build_parser
    from vaecf.errors import VaecfError
    from vaecf.io.bounds import bound, check_bounds, numeric_flags

    parser = build_parser(stage)
    for flag, dest in numeric_flags(parser):
        entry = bound(stage, flag)
        assert entry is not None, flag
        for value in (entry.high * 10 + 1, float("nan"), entry.low - 1):
            with pytest.raises(VaecfError, match=f"^{flag} "):
                check_bounds(stage, parser, argparse.Namespace(**{dest: value}))
        check_bounds(stage, parser, argparse.Namespace(**{dest: entry.high}))


@pytest.mark.parametrize(("flag", "value"), [
    ("--alternate", str(10**18)), ("--kl-per-item", "1e308"), ("--encoder-layers", "1000000"),
    ("--implicit-slim-lambda", "1e308"), ("--implicit-slim-alpha", "1e308"),
    ("--epochs", str(10**18)), ("--hidden", str(2**40)),
])
def test_train_refuses_a_number_past_its_bound(cli, flag: str, value: str) -> None:  # type: ignore[no-untyped-def]
    one_line("train", cli("train", *TRAIN, flag, value), f"{flag} ", ": expected ")
    assert not Path("nowhere").exists()


@pytest.mark.parametrize(("stage", "argv"), [
    ("split", ["--input", "nowhere/interactions", "--output", "nowhere/split",
               "--val-fraction", "nan"]),
    ("preprocess", ["--input", "nowhere/raw", "--output", "nowhere/interactions",
                    "--min-rating", "inf"]),
    ("download", ["--dataset", "synthetic", "--output", "nowhere/raw",
                  "--synthetic-users", str(2**40)]),
])
def test_other_stages_refuse_numbers_past_their_bounds(cli, stage: str, argv: list[str]) -> None:  # type: ignore[no-untyped-def]
    one_line(stage, cli(stage, *argv), f"{argv[-2]} ", ": expected ")
    assert not Path("nowhere").exists()
