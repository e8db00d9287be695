"""The docs site in a real browser: build it, serve it on localhost, open it in headless Chromium.

Needs the docs requirements (`make docs` installs them), Playwright (`python -m depthnb.docs deps
--browser`) and Debian's Chromium at /usr/bin/chromium. Without them the tests skip, unless
DEPTHNB_BROWSER_TESTS=1 (set it where CI installs them) turns a missing piece into a failure.
Screenshots: runs/docs-screenshots/.
"""
import json
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from _browser import CHROMIUM, require  # noqa: E402

from depthnb import docs, sitecheck  # noqa: E402

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parent.parent
SCREENSHOTS = ROOT / "runs" / "docs-screenshots"



@pytest.fixture(scope="module")
def site(tmp_path_factory):
    missing = docs.missing_requirements(docs.DOCS_REQUIREMENTS + sitecheck.BROWSER_REQUIREMENTS)
    require(not missing, f"missing {missing}: run `.venv/bin/python -m depthnb.docs deps --browser`")
    require(Path(CHROMIUM).exists(), f"{CHROMIUM} missing: apt-get install chromium")
    t0 = time.time()
    build = docs.build_docs(ROOT, tmp_path_factory.mktemp("site"), log=lambda *a: None)
    print(f"docs build: {time.time() - t0:.0f} s, {len(build.pages)} pages")
    return build


def _expected_images(site_source: Path, page: str) -> int:
    "Images a page must show: the image outputs stored in its notebook and its MyST figures."
    nb = json.loads((site_source / Path(page).with_suffix(".ipynb")).read_text())
    outputs = sum(any(k.startswith("image/") for k in o.get("data", {})) for c in nb["cells"] for o in c.get("outputs", []))
    figures = sum("".join(c["source"]).count(":::{figure}") for c in nb["cells"] if c["cell_type"] == "markdown")
    return outputs + figures


def test_every_notebook_becomes_a_page(site):
    assert site.failures == {}, f"notebooks nbdev could not process: {site.failures}"
    assert site.warnings == [], "Sphinx warnings:\n" + "\n".join(site.warnings)
    pages = docs.site_pages(ROOT / "nbs")
    assert sorted(site.pages) == sorted(docs.page_name(p) for p in pages.all())
    for page in site.pages:
        assert (site.site / page).is_file(), page
    # the API reference: show_doc entries are headings with nbdev's anchors
    solver = (site.site / "solver.html").read_text()
    assert 'id="solve_d_ff"' in solver and "depthnb.github.io" not in solver


def test_pages_render_in_chromium(site):
    result = sitecheck.check_site(site.site, sitecheck.CHECKED_PAGES, SCREENSHOTS, chromium=CHROMIUM)
    print(f"browser check: {result.seconds:.0f} s, {len(result.crawled)} pages crawled")
    assert result.problems(need_math=sitecheck.CHECKED_PAGES) == []
    source = ROOT / "_proc" / "_site"
    for check in result.pages:
        assert check.status == 200 and "depthnb" in check.title, check
        assert check.images >= _expected_images(source, check.page), check
        assert check.screenshot.stat().st_size > 10_000, check.screenshot
    figures, _ = docs.reproduced(ROOT)
    home = next(c for c in result.pages if c.page == "index.html")
    assert home.images >= len(figures) > 0, "the home page's gallery shows every figure under figures/"
    assert set(docs.page_name(p) for p in docs.site_pages(ROOT / "nbs").all()) <= set(result.crawled)
    assert result.search_results > 0
