"""MkDocs hook: the CLI and pipeline reference pages, generated at build time.

Every ``vaecf`` stage's page is made from the stage's own argparse parser
(``vaecf.cli.build_parser``), and the pipeline parameters from the compiled-in inputs of
``pipelines.vaecf_pipeline`` and ``pipelines.vaecf_sweep``, so the site and ``--help`` cannot
disagree: nothing in them is written twice. The pages are added to the nav under "CLI" and
"Pipeline parameters" (``mkdocs.yml`` names the sections, this hook fills them).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
CLI_DIR = "reference/cli"
PIPELINE_PAGE = "reference/pipeline-parameters.md"
CLI_SECTION = "CLI"  # the nav entry this hook fills with one page per stage
# Not a `vaecf` subcommand, but a CLI of its own: the pipeline's report step.
EXTRA_CLIS = {"kfp-report": "vaecf.stages.kfp_report"}


def _import_paths() -> None:
    """The repository's ``src`` (the library) and root (``pipelines``, ``components``)."""
    for path in (ROOT, ROOT / "src"):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))


def parsers() -> dict[str, tuple[str, argparse.ArgumentParser]]:
    """Stage name -> (one-line summary, its parser), in ``vaecf --help``'s order."""
    _import_paths()
    import importlib

    from vaecf.cli import STAGES, build_parser

    found = {stage: (summary, build_parser(stage)) for stage, summary in STAGES.items()}
    for name, module in EXTRA_CLIS.items():
        parser = importlib.import_module(module).build_parser()
        found[name] = (parser.description or "", parser)
    return found


def cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def escape(text: str) -> str:
    """Help text as written: no Markdown emphasis or HTML made of its ``*``, ``_`` or ``<``."""
    for char in "\\`*_[":
        text = text.replace(char, "\\" + char)
    return text.replace("<", "&lt;")


def flags_of(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.dest}` (positional)"
    return ", ".join(f"`{flag}`" for flag in action.option_strings)


def default_of(action: argparse.Action) -> str:
    if action.required:
        return "required"
    if action.default in (None, argparse.SUPPRESS) or isinstance(action, argparse._HelpAction):
        return ""
    if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
        return "off" if action.default is False else "on"
    value = action.default
    if isinstance(value, list | tuple):
        value = " ".join(str(v) for v in value)
    return f"`{value}`"


def values_of(action: argparse.Action) -> str:
    if action.choices:
        return " \\| ".join(f"`{c}`" for c in action.choices)
    if action.metavar:
        metavar = action.metavar
        return f"`{' '.join(metavar) if isinstance(metavar, tuple) else metavar}`"
    if action.nargs == 0:
        return "(a switch)"
    return f"`{action.dest.upper()}`"


def stage_page(stage: str, summary: str, parser: argparse.ArgumentParser) -> str:
    """The reference page of one stage: its summary, every flag as a table, then ``--help``."""
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"  # argparse wraps --help to the terminal; the page is fixed
    try:
        help_text = parser.format_help()
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old
    command = parser.prog
    rows = ["| flag | value | default | what it is |", "|---|---|---|---|"]
    formatter = parser._get_formatter()
    for action in parser._actions:
        text = formatter._expand_help(action) if action.help else ""  # %(default)s as --help
        rows.append(f"| {flags_of(action)} | {values_of(action)} | {cell(default_of(action))} | "
                    f"{cell(escape(text))} |")
    lines = [f"# `{command}`", "", cell(summary), "",
             "*Generated from the stage's parser when the site is built: the same text as "
             f"`{command} --help`.*", "", "## Flags", "", *rows, "", "## `--help`", "",
             "```text", help_text.rstrip(), "```", ""]
    return "\n".join(lines)


def cli_index(found: dict[str, tuple[str, argparse.ArgumentParser]]) -> str:
    rows = ["| command | what it does |", "|---|---|"]
    for stage, (summary, parser) in found.items():
        rows.append(f"| [`{parser.prog}`]({page_name(stage)}) | {cell(summary)} |")
    return "\n".join([
        "# CLI reference", "",
        "One console entry point, `vaecf`, with one subcommand per stage; every image runs "
        "`vaecf <stage> ...` and every pipeline component passes its inputs as flags to the same "
        "command. These pages are generated from the parsers themselves when the site is built.",
        "", *rows, "",
        "`kfp-report` is the pipeline's report step (`python -m vaecf.stages.kfp_report`), not "
        "a `vaecf` subcommand.", ""])


def page_name(stage: str) -> str:
    return f"{stage}.md"


def pipeline_page() -> str:
    _import_paths()
    from pipelines.vaecf_pipeline import build_pipeline
    from pipelines.vaecf_sweep import build_sweep

    parts = ["# Pipeline parameters", "",
             "Generated from the compiled pipelines' inputs when the site is built. Every "
             "parameter is a string, numbers included (see [the pipeline how-to]"
             "(../how-to/kubeflow-pipeline.md)); an empty default means the parameter is unset "
             "unless given.", ""]
    for title, made in (("`build/vaecf_pipeline.yaml` (`make pipeline`)", build_pipeline()),
                        ("`build/vaecf_sweep.yaml` (the tuning sweep)", build_sweep())):
        parts += [f"## {title}", "", "| parameter | type | default |", "|---|---|---|"]
        for name, spec in made.component_spec.inputs.items():  # type: ignore[attr-defined]
            default = "" if spec.default is None else f"`{spec.default}`"
            parts.append(f"| `{name}` | {spec.type} | {cell(default)} |")
        parts.append("")
    return "\n".join(parts)


def on_files(files: Files, config: Any) -> Files:
    found = parsers()
    generated = {f"{CLI_DIR}/index.md": cli_index(found), PIPELINE_PAGE: pipeline_page()}
    for stage, (summary, parser) in found.items():
        generated[f"{CLI_DIR}/{page_name(stage)}"] = stage_page(stage, summary, parser)
    for uri, content in generated.items():
        files.append(File.generated(config, uri, content=content))
    return files


def on_config(config: Any) -> Any:
    """Fill the nav's ``CLI`` section with the index and one page per stage."""
    found = parsers()
    pages = [f"{CLI_DIR}/index.md"] + [{f"vaecf {s}" if s != "kfp-report" else s:
                                        f"{CLI_DIR}/{page_name(s)}"} for s in found]

    def fill(items: list[Any]) -> bool:
        for item in items:
            if isinstance(item, dict):
                for key, value in item.items():
                    if key == CLI_SECTION:
                        item[key] = pages
                        return True
                    if isinstance(value, list) and fill(value):
                        return True
        return False

    if not fill(config["nav"]):
        raise ValueError(f"mkdocs.yml: the nav has no {CLI_SECTION!r} section to fill")
    return config
