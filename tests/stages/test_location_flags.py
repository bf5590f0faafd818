"""Every flag of every stage that names a location, attacked from one table.

``vaecf.stages.location_table`` lists each such flag with its role; ``run_stage`` checks them
all (``vaecf.io.roles.check_locations``) before the stage's body runs. This file walks the
table and runs the standard attacks of the flag's role against every entry, so a flag added
later is attacked without anyone writing a case for it: an existing file, another stage's
output, a place inside an input, a symbolic link into an input, ``/proc`` (a mount point),
a FIFO, glob characters, ``..`` and ``//`` in S3 keys, over-long names. Each must be refused
by that check, in one line naming the flag or the location, with nothing written anywhere.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

import vaecf.stages
from vaecf.cli import STAGES, build_parser
from vaecf.errors import VaecfError
from vaecf.io.location import STAGE_MANIFESTS
from vaecf.io.roles import Role, check_locations, values
from vaecf.stages import location_table, locations

TABLE = location_table(list(STAGES))
OUTPUTS = (Role.OUTPUT, Role.CHECKPOINTS, Role.TENSORBOARD, Role.WORKSPACE)
# Words in a flag's help that say it names a location: such a flag must be in the table.
LOCATION_WORDS = re.compile(r"s3://|\bdir\b|directory|folder|\bfile\b|\bpath\b|template|"
                            r"@file|prefix", re.IGNORECASE)


@dataclass
class World:
    """A sandbox holding real stage outputs, and what each stage is given by default."""

    root: Path
    raw: Path  # a 'vaecf download' output
    inter: Path  # a 'vaecf preprocess' output
    notes: Path  # a user's file
    folder: Path  # a user's folder

    def new(self, name: str) -> str:
        return str(self.root / "new" / name)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    from vaecf.cli import main

    root = tmp_path_factory.mktemp("world")
    raw, inter = root / "raw", root / "inter"
    assert main(["download", "--dataset", "synthetic", "--synthetic-users", "200",
                 "--synthetic-items", "80", "--output", str(raw)]) == 0
    assert main(["preprocess", "--input", str(raw), "--output", str(inter)]) == 0
    for name in ("split", "model"):
        (root / name).mkdir()
    (root / "notes.txt").write_text("mine")
    (root / "docs").mkdir()
    (root / "docs" / "thesis.txt").write_text("years of work")
    for name in ("log.jsonl", "metrics.json", "bench.json", "trials.jsonl", "space.json",
                 "pairs.csv", "template.yaml"):
        (root / "files").mkdir(exist_ok=True)
        (root / "files" / name).write_text("{}\n")
    return World(root, raw, inter, root / "notes.txt", root / "docs")


def base(stage: str, w: World) -> dict[str, str | list[str]]:
    """Flags with which ``stage`` passes every location check (other stages' outputs need
    only exist for that: the attacked flag is refused before any of them is read)."""
    f = w.root / "files"
    return {
        "download": {"--dataset": "synthetic", "--output": w.new("dl")},
        "preprocess": {"--input": str(w.raw), "--output": w.new("pp")},
        "split": {"--input": str(w.inter), "--output": w.new("sp")},
        "train": {"--split": str(w.root / "split"), "--output": w.new("model"),
                  "--checkpoint-dir": w.new("ckpt"), "--tensorboard-dir": w.new("tb")},
        "evaluate": {"--split": str(w.root / "split"), "--model": str(w.root / "model"),
                     "--output": w.new("ev")},
        "recommend": {"--model": str(w.root / "model"), "--input": str(f / "pairs.csv"),
                      "--output": w.new("rec")},
        "serve": {"--model": str(w.root / "model")},
        "benchmark-serve": {"--model": str(w.root / "model"), "--output": w.new("bs")},
        "report": {"--output": w.new("rep"), "--train-log": str(f / "log.jsonl"),
                   "--metrics": str(f / "metrics.json"), "--benchmark": str(f / "bench.json"),
                   "--manifests": [str(w.raw)], "--reference": str(f / "bench.json"),
                   "--trials": str(f / "trials.jsonl")},
        "benchmark": {"--split": str(w.root / "split"), "--output": w.new("bench")},
        "launch-mpijob": {"--split": str(w.root / "split"), "--output": w.new("lm"),
                          "--store": "s3://bucket/store", "--run-id": "r1",
                          "--image": "registry/vaecf:1", "--template": str(f / "template.yaml")},
        "launch-sparkapp": {"--stage": "split", "--input": str(w.inter),
                            "--output": w.new("ls"), "--store": "s3://bucket/store",
                            "--run-id": "r1", "--image": "registry/vaecf:1",
                            "--template": str(f / "template.yaml")},
        "tune": {"--split": str(w.root / "split"), "--output": w.new("tune"),
                 "--space": "@" + str(f / "space.json"),
                 "--collect-models": [str(w.root / "model")],
                 "--collect-evaluations": [str(w.root / "model")]},
        "deploy": {"--model": str(w.root / "model"), "--store": "s3://bucket/store",
                   "--run-id": "r1", "--image": "registry/vaecf:1",
                   "--template": str(f / "template.yaml")},
        "demo": {"--output": w.new("demo"), "--source": str(w.raw)},
    }[stage]


def argv(flags: dict[str, str | list[str]]) -> list[str]:
    out: list[str] = []
    for flag, value in flags.items():
        out += [flag, *value] if isinstance(value, list) else [flag, value]
    return out


def first_input(stage: str, w: World) -> Path:
    """A folder this stage reads (another stage's output when it reads none)."""
    for flag, value in base(stage, w).items():
        entry = next((loc for s, f, loc in TABLE if s == stage and f == flag), None)
        if entry is not None and entry.role is Role.INPUT:
            return Path(value[0] if isinstance(value, list) else value)
    return w.raw


def attacks(stage: str, role: Role, w: World) -> dict[str, str]:
    """The standard attacks on a flag of ``role`` (the value it is given)."""
    source = first_input(stage, w)
    os.makedirs(w.root / "links", exist_ok=True)
    link = w.root / "links" / f"to-{source.name}"
    if not link.is_symlink():
        link.symlink_to(source)
    fifo = w.root / "fifo"
    if not fifo.exists():
        os.mkfifo(fifo)
    common = {
        "proc": "/proc/self/vaecf",
        "mount-point": "/proc",
        "s3-dotdot": "s3://bucket/runs/../raw",
        "s3-double-slash": "s3://bucket/runs//raw",
        "long-name": str(w.root / ("x" * 300)),
        "long-path": str(w.root / "/".join(["d" * 200] * 20)),
        "blank": "\u2003\u00a0",
    }
    if role in OUTPUTS:
        other = w.inter if stage == "download" else w.raw
        return {**common,
                "existing-file": str(w.notes),
                "users-folder": str(w.folder),
                "other-stage-output": str(other),
                "inside-input": str(source / "sub"),
                "symlink-into-input": str(link / "sub"),
                "glob-inside-input": str(source / "*"),
                "inside-other-output": str(other / "sub")}
    if role is Role.STORE:
        return {k: v for k, v in common.items() if k.startswith("s3")} | {
            "local-path": str(w.root / "store")}
    wrong_kind = str(w.notes) if role is Role.INPUT else str(fifo)
    return {**common,
            "wrong-kind": wrong_kind,
            "fifo": str(fifo),
            "device": "/dev/zero",
            "glob": str(w.raw.parent / "ra?"),
            "missing": str(w.root / "no-such-thing")}


def snapshot(root: Path) -> dict[str, str]:
    """Every entry below ``root`` (links not followed) with what it is and holds."""
    found = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            found[rel] = "link:" + os.readlink(path)
        elif path.is_file():
            found[rel] = path.read_bytes().hex()[:64] + str(path.stat().st_size)
        else:
            found[rel] = "dir" if path.is_dir() else "other"
    return found


def _cases() -> list[tuple[str, str, Role, str]]:
    return [(stage, flag, loc.role, attack) for stage, flag, loc in TABLE
            for attack in _attack_names(loc.role)]


def _attack_names(role: Role) -> list[str]:
    common = ["proc", "mount-point", "s3-dotdot", "s3-double-slash", "long-name", "long-path",
              "blank"]
    if role in OUTPUTS:
        return [*common, "existing-file", "users-folder", "other-stage-output",
                "inside-input", "symlink-into-input", "glob-inside-input",
                "inside-other-output"]
    if role is Role.STORE:
        return ["s3-dotdot", "s3-double-slash", "local-path"]
    return [*common, "wrong-kind", "fifo", "device", "glob", "missing"]


@pytest.fixture()
def spy(monkeypatch: pytest.MonkeyPatch) -> list[BaseException | None]:
    """What ``run_stage``'s location check raised (None: it passed), call by call."""
    outcomes: list[BaseException | None] = []

    def checked(given):  # type: ignore[no-untyped-def]
        try:
            check_locations(given)
        except BaseException as err:
            outcomes.append(err)
            raise
        outcomes.append(None)

    monkeypatch.setattr(vaecf.stages, "check_locations", checked)
    return outcomes


def test_the_table_holds_every_stages_location_flags() -> None:
    """A flag whose help speaks of a file, folder, prefix or template is in the table."""
    registered = {(stage, flag) for stage, flag, _ in TABLE}
    missing = []
    for stage in STAGES:
        for action in build_parser(stage)._actions:
            text = f"{action.help or ''} {action.metavar or ''}"
            named = [o for o in action.option_strings if o.startswith("--")]
            if named and (action.type is Path or LOCATION_WORDS.search(text)) and \
                    (stage, named[0]) not in registered:
                missing.append(f"{stage} {named[0]}")
    # Flags whose help mentions a file but which name none (a count, a choice, a size).
    missing = [m for m in missing if m not in NOT_LOCATIONS]
    assert not missing, f"location flags missing from the table: {missing}"
    outputs = {loc.manifest for _, _, loc in TABLE if loc.role is Role.OUTPUT}
    assert outputs <= STAGE_MANIFESTS, "a stage's manifest marks its outputs for every check"
    roles = {loc.role for _, _, loc in TABLE}
    assert {Role.INPUT, Role.INPUT_FILE, Role.OUTPUT, Role.CHECKPOINTS, Role.TENSORBOARD,
            Role.LOCAL_FILE, Role.WORKSPACE, Role.STORE} <= roles


# Flags whose help text speaks of files without naming one (reviewed by hand).
NOT_LOCATIONS = {"evaluate --export-top-k", "launch-mpijob --tensorboard",
                 "tune --executor-input", "serve --workers"}


@pytest.mark.parametrize("stage", list(STAGES))
def test_the_base_flags_pass_the_check(stage: str, world: World) -> None:
    """The attacks below change one flag of these: without it, nothing is refused."""
    parser = build_parser(stage)
    args = parser.parse_args(argv(base(stage, world)))
    check_locations((flag, where, value) for dest, (flag, where) in locations(parser).items()
                    for value in values(where, dest, args))


@pytest.mark.parametrize("stage,flag,role,attack", _cases(),
                         ids=[f"{s}{f}-{a}" for s, f, _, a in _cases()])
def test_every_location_flag_refuses_every_attack(cli, world: World, spy, stage: str,
                                                  flag: str, role: Role, attack: str) -> None:
    made = attacks(stage, role, world)
    assert sorted(made) == sorted(_attack_names(role))
    value = made[attack]
    location = next(loc for s, f, loc in TABLE if s == stage and f == flag)
    given = dict(base(stage, world))
    given[flag] = location.prefix + value
    if isinstance(base(stage, world).get(flag), list):
        given[flag] = [value]
    before = snapshot(world.root)
    code, _, err = cli(stage, *argv(given))
    assert code == 1, err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"vaecf {stage}: error: "), err
    assert spy and isinstance(spy[-1], VaecfError), "refused by the location check"
    assert flag in err or value[:60] in err, err
    assert snapshot(world.root) == before
