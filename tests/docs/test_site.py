"""The documentation site: it builds with ``--strict`` (CI's check), its CLI reference shows
every flag of every parser and its pipeline reference every parameter, a broken link fails
the build, and the built home page and a reference page render in headless Chromium with
their navigation and every asset they ask for."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import chromium
import pytest

ROOT = Path(__file__).resolve().parents[2]
MKDOCS = Path(sys.executable).with_name("mkdocs")


def build(config_dir: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """``mkdocs build --strict`` of the ``mkdocs.yml`` in ``config_dir`` into ``site``."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT),
                                          os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([str(MKDOCS), "build", "--strict", "--site-dir", str(site)],
                          cwd=config_dir, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built once (as `make docs-build` and CI build it)."""
    out = tmp_path_factory.mktemp("site")
    done = build(ROOT, out)
    assert done.returncode == 0, done.stderr[-4000:]
    return out


def stage_parsers() -> dict[str, argparse.ArgumentParser]:
    from vaecf.cli import STAGES, build_parser
    from vaecf.stages import kfp_report

    return {**{stage: build_parser(stage) for stage in STAGES},
            "kfp-report": kfp_report.build_parser()}


def text_of(html: str) -> str:
    """``html``'s text as a reader sees it (tags dropped, the entities of help texts undone)."""
    text = re.sub(r"<[^>]+>", "", html)
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def test_every_flag_of_every_parser_is_on_its_reference_page(site: Path) -> None:
    for stage, parser in stage_parsers().items():
        page = site / "reference" / "cli" / stage / "index.html"
        assert page.is_file(), f"no reference page for {stage}"
        tables = re.findall(r"<table>.*?</table>", page.read_text(), re.DOTALL)
        assert tables, f"{page}: no table of flags"
        text = text_of(tables[0])  # the table of flags (the --help block below it is a copy)
        shown = set(re.findall(r"(?<![\w-])(--?[\w][\w-]*)", text))
        for action in parser._actions:
            for flag in action.option_strings:
                assert flag in shown, f"vaecf {stage} {flag}: not on its reference page"
            if not action.option_strings:
                assert action.dest in text, f"vaecf {stage} {action.dest}: not on its page"
            if action.help and action.help != argparse.SUPPRESS:
                said = parser._get_formatter()._expand_help(action)
                assert " ".join(said.split()) in " ".join(text.split()), (stage, action.dest)


def test_every_pipeline_parameter_is_on_the_reference(site: Path) -> None:
    from pipelines.vaecf_pipeline import build_pipeline
    from pipelines.vaecf_sweep import build_sweep

    text = text_of((site / "reference" / "pipeline-parameters" / "index.html").read_text())
    for made in (build_pipeline(), build_sweep()):
        for name in made.component_spec.inputs:
            assert re.search(rf"(?<!\w){name}(?!\w)", text), f"pipeline parameter {name}"


def test_a_broken_link_fails_the_strict_build(tmp_path: Path) -> None:
    copy = tmp_path / "repo"
    shutil.copytree(ROOT / "docs", copy / "docs")
    shutil.copy(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    page = copy / "docs" / "troubleshooting.md"
    page.write_text(page.read_text() + "\nSee [the old page](no-such-page.md).\n")
    done = build(copy, tmp_path / "site")
    assert done.returncode != 0
    assert "no-such-page.md" in done.stderr


class _Recording(SimpleHTTPRequestHandler):
    """Serves the built site and records every request's path and status."""

    seen: list[tuple[str, int]]

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        self.seen.append((self.path, int(code)))


@pytest.fixture()
def served(site: Path) -> Iterator[tuple[str, list[tuple[str, int]]]]:
    seen: list[tuple[str, int]] = []
    handler = type("Handler", (_Recording,), {"seen": seen})
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(handler, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("path", ["", "reference/cli/train/"])
def test_page_renders_in_chromium_with_its_navigation_and_assets(
        site: Path, served: tuple[str, list[tuple[str, int]]], path: str, tmp_path: Path) -> None:
    base, seen = served
    html = (site / path / "index.html").read_text()
    assert 'class="md-nav' in html and "md-header" in html  # the theme's navigation
    assets = set(re.findall(r'(?:href|src)="([^"#:]+\.(?:css|js|png|svg))"', html))
    assert assets, "the page asks for no stylesheet or script: not the theme's page"
    pixels = chromium.screenshot(f"{base}/{path}", tmp_path / "shot.png", tmp_path / "profile",
                                 width=1400, height=1000)  # wide enough for the nav sidebar
    assert pixels.shape[:2] == (1000, 1400)
    assert pixels[..., :3].std() > 0.05  # a blank or unstyled-white page has little
    assert (pixels[..., :3].mean(axis=2) < 0.5).mean() > 0.005  # dark text
    requested = {p.split("?")[0] for p, _ in seen}
    missing = [(p, code) for p, code in seen if code >= 400 and not p.startswith("/favicon")]
    assert not missing, f"assets the page asked for and did not get: {missing}"
    names = {p.rsplit("/", 1)[-1] for p in requested}
    css = {a.rsplit("/", 1)[-1] for a in assets if a.endswith(".css")}
    assert css and css <= names, f"stylesheets not loaded: {css - names}"


def test_readme_is_a_front_page_whose_links_lead_into_the_site() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    assert "make demo" in readme and "make test" in readme  # the two commands (CI runs the 2nd)
    links = re.findall(r"\]\((docs/[^)#]+)(?:#[^)]*)?\)", readme)
    assert links, "README links nowhere into the site"
    missing = [link for link in links if not (ROOT / link).is_file()]
    assert not missing, f"README links to pages that do not exist: {missing}"


def test_the_architecture_page_draws_the_layers_make_lint_enforces() -> None:
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = [c for c in config["contracts"] if c["id"] == "layers"]
    enforced = [set(re.split(r"\s*[:|]\s*", layer.strip())) for layer in contract["layers"]]
    page = (ROOT / "docs" / "concepts" / "architecture.md").read_text()
    rows = re.findall(r"^\| [^|]+ \| ((?:`\w+`,? ?)+) \|", page, re.MULTILINE)
    drawn = [set(re.findall(r"`(\w+)`", row)) for row in rows]
    assert drawn == enforced, "docs/concepts/architecture.md's table is not the layers contract"
