"""Thin CLIs, one per stage: parse flags -> frozen config -> library call -> outputs.

Every stage module defines ``build_parser()`` and ``main(argv) -> int``; ``main`` delegates
to ``run_stage`` so that every stage reports errors the same way: one line
``vaecf <stage>: error: <what>`` on stderr and exit status 1, whether the flags or the data
are wrong (argparse's own errors included, which would otherwise print a usage block and
exit 2).

Every flag that names a location is added with ``location(parser, flag, role, ...)``:
``run_stage`` checks all of them (``vaecf.io.roles``) before the stage's body runs, and
``location_table`` lists them for the tests that attack every one. Every flag that takes a
number has its bounds in the one table of ``vaecf.io.bounds``, checked there too.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from vaecf.errors import VaecfError
from vaecf.io.bounds import MAX_SEED, check_bounds
from vaecf.io.publish import DISK_ERRORS
from vaecf.io.roles import Location, Role, check_locations, values


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows an option's default, unless it has none or its help already says it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.default in (None, False, argparse.SUPPRESS) or "default" in text:
            return text
        return super()._get_help_string(action)


class _Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are ``VaecfError``: one line, exit 1, like the rest."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.locations: dict[str, tuple[str, Location]] = {}  # dest -> (flag, location)

    def error(self, message: str) -> NoReturn:
        raise VaecfError(f"{message} (see '{self.prog} --help')")


def location(parser: argparse.ArgumentParser, flag: str, role: Role, *, manifest: str = "",
             prefix: str = "", derive: Callable[[Any], Any] | None = None,
             holds: frozenset[str] = frozenset(),
             manifest_of: Callable[[Any], str] | None = None, **kwargs: Any) -> argparse.Action:
    """Add the flag ``flag``, which names a location of role ``role``, and register it.

    ``manifest``, ``prefix``, ``derive``, ``holds`` and ``manifest_of`` are
    ``vaecf.io.roles.Location``'s; the other keyword arguments are ``add_argument``'s.
    """
    action = parser.add_argument(flag, **kwargs)
    registry: dict[str, tuple[str, Location]] = getattr(parser, "locations")  # noqa: B009
    registry[action.dest] = (flag, Location(role, manifest, prefix, derive, holds,
                                            manifest_of))
    return action


def locations(parser: argparse.ArgumentParser) -> dict[str, tuple[str, Location]]:
    """The location flags of a stage's parser: dest -> (flag, location)."""
    return dict(getattr(parser, "locations", {}))


def location_table(stages: list[str]) -> list[tuple[str, str, Location]]:
    """(stage, flag, location) of every location flag of ``stages``: the one table."""
    from vaecf.cli import build_parser  # the CLI imports the stages, not the other way

    return [(stage, flag, where) for stage in stages
            for flag, where in locations(build_parser(stage)).values()]


def new_parser(stage: str, description: str) -> argparse.ArgumentParser:
    return _Parser(prog=f"vaecf {stage}", description=description,
                   formatter_class=_HelpFormatter)


def seed(text: str) -> int:
    """argparse type of every ``--seed``: an integer in 0 .. ``MAX_SEED``."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"expected an integer from 0 to {MAX_SEED}, got {text}")
    return value


def finite_non_negative(text: str) -> float:
    """argparse type of a weight that may be 0 (``--beta-cap``, ``--l2``): finite, >= 0."""
    value = float(text)
    if not (math.isfinite(value) and value >= 0.0):
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text}")
    return value


def finite_positive(text: str) -> float:
    """argparse type of a rate or a time (``--learning-rate``, ``--timeout``): finite and > 0
    (nan and inf refused)."""
    value = float(text)
    if not (math.isfinite(value) and value > 0.0):
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text}")
    return value


def launcher_flags(parser: argparse.ArgumentParser, *, resource: str, image: str,
                   secret_for: str, template: str, timeout: float) -> None:
    """The flags of a step that runs its work as a Kubernetes resource (``launch-mpijob``,
    ``launch-sparkapp``): the run id that names the resource, its image and namespace, the S3
    Secret, the template, and the deadlines."""
    from vaecf.k8s.client import REQUEST_TIMEOUT
    from vaecf.k8s.job import CLEANUP_SECONDS

    parser.add_argument("--run-id", required=True,
                        help=f"pipeline run id; the {resource}'s name is derived from it")
    parser.add_argument("--image", required=True, help=image)
    parser.add_argument("--namespace", help="default: this pod's namespace, else 'default'")
    parser.add_argument("--secret-name", default="vaecf-s3",
                        help="Secret with AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, "
                             f"AWS_ENDPOINT_URL for {secret_for}")
    # A str, not a Path: Path("s3://b/k") is the local "s3:/b/k", which the check would miss.
    location(parser, "--template", Role.LOCAL_FILE, default=None, help=template)
    parser.add_argument("--timeout", type=finite_positive, default=timeout,
                        help=f"deadline in seconds for the step's Kubernetes calls and the "
                             f"{resource}: then the {resource} is deleted (within "
                             f"{CLEANUP_SECONDS:g} s more) "
                             "and the step fails (also its activeDeadlineSeconds, which stops "
                             "it if the step dies)")
    parser.add_argument("--request-timeout", type=finite_positive, default=REQUEST_TIMEOUT,
                        help="seconds each Kubernetes API call may wait for an answer")


def run_stage(stage: str, parser: argparse.ArgumentParser, argv: list[str] | None,
              body: Callable[[argparse.Namespace], None]) -> int:
    """Parse ``argv`` and run ``body``; a ``VaecfError`` becomes one line on stderr, exit 1.

    So does an ``OSError`` the user fixes outside vaecf (a full disk or quota, a read-only or
    failing device) that a stage's publish did not already describe (``vaecf.io.publish``).
    """
    try:
        args = parser.parse_args(argv)
        check_bounds(stage, parser, args)
        check_locations((flag, where.given(args), value)
                        for dest, (flag, where) in locations(parser).items()
                        for value in values(where, dest, args))
        body(args)
    except (VaecfError, OSError) as err:
        if isinstance(err, OSError):
            if err.errno not in DISK_ERRORS:
                raise
            err = VaecfError(f"{err.filename or 'writing'}: {os.strerror(err.errno)}")
        message = str(err).replace("\n", " ")
        print(f"vaecf {stage}: error: {message}", file=sys.stderr, flush=True)
        return 1
    return 0
