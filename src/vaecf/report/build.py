"""Assemble the report: the verdict first, then accuracy, training, speed and provenance.

Each part is present only when its input was given. ``report.json`` holds the numbers the
Markdown and HTML show (copied from the inputs, plus what was derived from them).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vaecf.errors import VaecfError
from vaecf.report import accuracy, provenance, speed, speed_render, training, tuning
from vaecf.report.document import Section, to_html, to_markdown
from vaecf.report.inputs import ReportInputs

TITLE = "vaecf run report"
FILES = ("report.md", "report.html", "report.json")


def build(inputs: ReportInputs) -> tuple[dict[str, Any], list[Section]]:
    """The report's data (for ``report.json``) and its sections, verdict first."""
    if not (inputs.train_log or inputs.metrics or inputs.benchmark or inputs.manifests
            or inputs.trials):
        raise VaecfError("nothing to report: give at least one of --train-log, --metrics, "
                         "--benchmark, --manifests, --trials")
    data: dict[str, Any] = {"inputs": inputs.sources}
    verdict: list[str] = []
    sections: list[Section] = []
    if inputs.metrics:
        data["accuracy"] = accuracy.analyse(inputs.metrics, inputs.manifests)
        verdict += accuracy.verdict(data["accuracy"])
        sections.append(accuracy.section(data["accuracy"]))
    if inputs.trials:
        data["tuning"] = tuning.analyse(inputs.trials)
        verdict += tuning.verdict(data["tuning"])
        sections.append(tuning.section(data["tuning"]))
    if inputs.train_log:
        data["training"] = training.analyse(inputs.train_log)
        verdict += training.verdict(data["training"])
        sections.append(training.section(data["training"]))
    if inputs.benchmark:
        data["speed"] = speed.analyse(inputs.benchmark, inputs.reference)
        verdict += speed.verdict(data["speed"])
        sections.append(speed_render.section(data["speed"]))
    prov = provenance.analyse(inputs.manifests, inputs.benchmark)
    data.update({k: v for k, v in prov.items() if v})
    train_config = ({k: data["training"][k] for k in ("precision", "world_size", "batch_size")}
                    if "training" in data else None)
    for part in (provenance.dataset_section(prov),
                 provenance.configuration_section(prov, train_config),
                 provenance.fingerprint_section(prov)):
        if part is not None:
            sections.append(part)
    if not verdict:
        verdict.append("No accuracy, training or benchmark input: provenance only.")
    data["verdict"] = verdict
    return data, [Section("Verdict", [verdict], css_class="verdict"), *sections]


def write(directory: Path, inputs: ReportInputs) -> dict[str, Any]:
    """Write ``report.md``, ``report.html`` and ``report.json`` into ``directory``."""
    data, sections = build(inputs)
    (directory / "report.md").write_text(to_markdown(TITLE, sections))
    (directory / "report.html").write_text(to_html(TITLE, sections))
    (directory / "report.json").write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return data
