"""The report as a format-neutral document, rendered to Markdown and to self-contained HTML.

Sections hold paragraphs, tables of already formatted strings and figures (PNG bytes). Both
renderers read the same strings, so a number reads the same in ``report.md`` and
``report.html``; figures appear only in the HTML (embedded as base64 ``data:`` URIs, so the
file opens offline and references nothing outside itself).
"""

from __future__ import annotations

import base64
import html
import re
from dataclasses import dataclass, field

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;max-width:1100px;
margin:2em auto;padding:0 1em;color:#1d2430;line-height:1.45}
h1{border-bottom:2px solid #2c5d8f;padding-bottom:.2em}
h2{margin-top:1.6em;color:#2c5d8f;border-bottom:1px solid #d5dde6}
table{border-collapse:collapse;margin:.6em 0 1em;font-size:.92em}
th,td{border:1px solid #c9d2dc;padding:.25em .6em;text-align:left}
th{background:#eef3f8}td.num{text-align:right;white-space:nowrap}
caption{caption-side:top;text-align:left;font-weight:600;padding:.3em 0}
.verdict{background:#f4f8ec;border-left:5px solid #5b8c2a;padding:.5em 1em}
.verdict li{margin:.2em 0}
figure{margin:1em 0}figure img{max-width:100%;border:1px solid #e1e6ec}
figcaption{font-size:.9em;color:#555}
"""


_NUMERIC = re.compile(r"^[-+]?[\d,.]+(?:x|%)?(?: \(.*\))?$")


def fmt(value: float | None, digits: int = 4) -> str:
    """A measured number as the report prints it: ``-`` if missing, else fixed digits."""
    return "-" if value is None else f"{float(value):,.{digits}f}"


def fmt_count(value: int | None) -> str:
    """A count with thousands separators (``-`` if missing)."""
    return "-" if value is None else f"{int(value):,}"


def fmt_ratio(value: float | None) -> str:
    """A speed-up or ratio such as ``1.73x``."""
    return "-" if value is None else f"{value:.2f}x"


def fmt_percent(value: float | None) -> str:
    """A share in [0, 1] as a percentage with one decimal."""
    return "-" if value is None else f"{100.0 * value:.1f}%"


@dataclass(frozen=True)
class Table:
    """A table of formatted cells; the first column is the row label."""

    columns: list[str]
    rows: list[list[str]]
    caption: str = ""


@dataclass(frozen=True)
class Figure:
    """A plot, already rendered to PNG."""

    caption: str
    png: bytes


@dataclass
class Section:
    """A titled section: blocks are paragraphs (str), bullet lists (list[str]), tables, figures."""

    title: str
    blocks: list[str | list[str] | Table | Figure] = field(default_factory=list)
    css_class: str = ""


def to_markdown(title: str, sections: list[Section]) -> str:
    """Render as GitHub-flavoured Markdown (figures are named, not embedded)."""
    lines = [f"# {title}", ""]
    for section in sections:
        lines += [f"## {section.title}", ""]
        for block in section.blocks:
            lines += [*_markdown_block(block), ""]
    return "\n".join(lines).rstrip() + "\n"


def _markdown_block(block: str | list[str] | Table | Figure) -> list[str]:
    if isinstance(block, str):
        return [block]
    if isinstance(block, list):
        return [f"- {item}" for item in block]
    if isinstance(block, Figure):
        return [f"*Figure (in report.html): {block.caption}*"]
    lines = [f"**{block.caption}**", ""] if block.caption else []
    lines.append("| " + " | ".join(block.columns) + " |")
    numeric = [all(_NUMERIC.match(row[i]) for row in block.rows)
               for i in range(len(block.columns))]
    lines.append("|" + "|".join("---:" if n else "---" for n in numeric) + "|")
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |"
              for row in block.rows]
    return lines


def to_html(title: str, sections: list[Section]) -> str:
    """Render as one self-contained HTML page (inline CSS, figures as data: URIs)."""
    body: list[str] = [f"<h1>{html.escape(title)}</h1>"]
    for section in sections:
        attrs = f' class="{section.css_class}"' if section.css_class else ""
        body.append(f"<section{attrs}><h2>{html.escape(section.title)}</h2>")
        body += [_html_block(block) for block in section.blocks]
        body.append("</section>")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(title)}</title><style>{_CSS}</style></head>\n<body>\n"
            + "\n".join(body) + "\n</body></html>\n")


def _html_block(block: str | list[str] | Table | Figure) -> str:
    if isinstance(block, str):
        return f"<p>{html.escape(block)}</p>"
    if isinstance(block, list):
        return "<ul>" + "".join(f"<li>{html.escape(item)}</li>" for item in block) + "</ul>"
    if isinstance(block, Figure):
        data = base64.b64encode(block.png).decode("ascii")
        caption = html.escape(block.caption)
        return (f'<figure><img alt="{caption}" src="data:image/png;base64,{data}">'
                f"<figcaption>{caption}</figcaption></figure>")
    caption = f"<caption>{html.escape(block.caption)}</caption>" if block.caption else ""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in block.columns)
    rows = "".join("<tr>" + "".join(_html_cell(c) for c in row) + "</tr>"
                   for row in block.rows)
    return f"<table>{caption}<thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"


def _html_cell(cell: str) -> str:
    """A table cell; numbers are right-aligned so their digits line up."""
    css = ' class="num"' if _NUMERIC.match(cell) else ""
    return f"<td{css}>{html.escape(cell)}</td>"
