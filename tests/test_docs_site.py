"""The docs site (mkdocs.yml, docs/): it builds with warnings as errors, every page of
its nav comes out, and its Results page is the table benchmarks/report.py writes."""
import os
import subprocess
import sys

import pytest
import yaml
from helpers import REPO

sys.path.insert(0, os.path.join(REPO, "benchmarks"))
import report  # noqa: E402  (benchmarks/ is not a package)


def nav_pages() -> list:
    """The Markdown files mkdocs.yml's nav names, in its order."""
    with open(os.path.join(REPO, "mkdocs.yml")) as fh:
        nav = yaml.safe_load(fh)["nav"]
    return [page for entry in nav for page in entry.values()]


def built_page(site: str, page: str) -> str:
    """Where mkdocs writes a page (directory URLs): index.md as index.html, x.md as x/index.html."""
    name = page[:-len(".md")]
    return os.path.join(site, "index.html" if name == "index" else os.path.join(name, "index.html"))


def test_the_site_builds_strictly_with_every_page_of_its_nav(tmp_path):
    pytest.importorskip("mkdocs", reason="mkdocs is not installed: python -m pip install mkdocs (the dev extra has it)")
    site = str(tmp_path / "site")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", site],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    pages = nav_pages()
    assert pages[0] == "index.md" and "results.md" in pages
    missing = [page for page in pages if not os.path.isfile(built_page(site, page))]
    assert not missing, f"nav pages the build did not write: {missing}"


def test_the_results_page_is_what_report_py_writes():
    with open(report.PAGE) as fh:
        text = fh.read()
    assert text == report.page(report.table(report.RESULTS)), \
        "docs/results.md is stale: python benchmarks/report.py"
