"""Thin CLIs, one per stage: parse flags -> frozen config -> library call -> outputs.

Every stage module defines ``build_parser()`` and ``main(argv) -> int``; ``main`` delegates
to ``run_stage`` so that every stage reports errors the same way.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from vaecf.errors import VaecfError


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows an option's default, unless it has none or its help already says it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.default in (None, False, argparse.SUPPRESS) or "default" in text:
            return text
        return super()._get_help_string(action)


def new_parser(stage: str, description: str) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(prog=f"vaecf {stage}", description=description,
                                   formatter_class=_HelpFormatter)


def run_stage(stage: str, parser: argparse.ArgumentParser, argv: list[str] | None,
              body: Callable[[argparse.Namespace], None]) -> int:
    """Parse ``argv`` and run ``body``; a ``VaecfError`` becomes one line on stderr, exit 1."""
    args = parser.parse_args(argv)
    try:
        body(args)
    except VaecfError as err:
        message = str(err).replace("\n", " ")
        print(f"vaecf {stage}: error: {message}", file=sys.stderr, flush=True)
        return 1
    return 0
