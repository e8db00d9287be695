"""The docs site in a real browser: build it, serve it on localhost, open every page in headless Chromium.

Needs the docs requirements (`make docs` installs them), Playwright (`python -m depthnb.cmd_docs deps
--browser`) and Debian's Chromium at /usr/bin/chromium. Without them the tests skip, unless
DEPTHNB_BROWSER_TESTS=1 (set it where CI installs them) turns a missing piece into a failure.
Screenshots: runs/docs-screenshots/.
"""
import json
import re
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from _browser import CHROMIUM, require  # noqa: E402

from depthnb.tools import docs, pages, site_results, sitecheck  # noqa: E402

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parent.parent
SCREENSHOTS = ROOT / "runs" / "docs-screenshots"
HOME_MAX_PX = 10_000


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    missing = docs.missing_requirements(docs.DOCS_REQUIREMENTS + sitecheck.BROWSER_REQUIREMENTS)
    require(not missing, f"missing {missing}: run `.venv/bin/python -m depthnb.cmd_docs deps --browser`")
    require(Path(CHROMIUM).exists(), f"{CHROMIUM} missing: apt-get install chromium")
    t0 = time.time()
    build = docs.build_docs(ROOT, tmp_path_factory.mktemp("site"), log=lambda *a: None)
    print(f"docs build: {time.time() - t0:.0f} s, {len(build.pages)} pages")
    return build


def _expected_images(site_source: Path, page: str) -> int:
    "Images a page must show: the image outputs stored in its notebook and the <img> tags of its Markdown."
    generated = site_source / Path(page).with_suffix(".md")
    if generated.exists():  # a page the build writes as Markdown: the Results page, the reports
        text = generated.read_text()
        return text.count("<img ") + len(re.findall(r"!\[[^\]]*\]\(", text))
    nb = json.loads((site_source / Path(page).with_suffix(".ipynb")).read_text())
    outputs = sum(any(k.startswith("image/") for k in o.get("data", {})) for c in nb["cells"] for o in c.get("outputs", []))
    tags = sum("".join(c["source"]).count("<img ") for c in nb["cells"] if c["cell_type"] == "markdown")
    return outputs + tags


def test_every_notebook_becomes_a_page(site):
    assert site.failures == {}, "notebooks nbdev could not process:\n" + "\n".join(f"nbs/{nb}: {err}" for nb, err in site.failures.items())
    assert site.warnings == [], "Sphinx warnings:\n" + "\n".join(site.warnings)
    site_pages = pages.site_pages(ROOT / "nbs")
    presets = site_results.shown_presets(ROOT)
    results = ["results.html"] + [f"report-{p}.html" for p in presets]
    assert sorted(site.pages) == sorted([pages.page_name(p) for p in site_pages.all()] + results)
    for page in site.pages:
        assert (site.site / page).is_file(), page
    # the API reference: show_doc entries are headings with nbdev's anchors, readable signatures
    solver = (site.site / "solver.html").read_text()
    assert 'id="solve_d_ff"' in solver and "depthnb.github.io" not in solver
    # no signature shows the type nbdev infers for a builtin default (myst.html's own code and tests show the raw form)
    raw = [p for p in site.pages if p != "myst.html" and "builtin_function_or_method" in (site.site / p).read_text()]
    assert raw == [], raw
    # the Results page comes first in the navigation, after the home page, then the guides; the tooling comes last
    home = (site.site / "index.html").read_text()
    nav = home[home.index('class="bd-links'):]
    assert (nav.index("results.html") < nav.index("guides/running.html") < nav.index("config.html")
            < nav.index("experiments/petty_shapes.html") < nav.index('href="plan.html"'))
    # the home page: what the repository shows, the headline verdicts linked, how to run it, where to read on
    for section in ("headline-results", "run-it", "read-on"):
        assert f'id="{section}"' in home, section
    headline = home[home.index('id="headline-results"'):home.index('id="run-it"')]
    assert 'class="depthnb-verdict ' in headline and "results.html#preset-" in headline and "experiments/" in headline
    read_on = home[home.index('id="read-on"'):]
    for guide in ("guides/running.html", "guides/beyond.html", "guides/reliability.html", "report-cpu.html"):
        assert f'href="{guide}' in read_on, guide
    assert not re.search(r'href="[^"]*REPORT\.md', home)  # GitHub's links to a report lead to its page


def test_results_page_and_experiment_pages(site):
    presets = site_results.shown_presets(ROOT)
    if not presets:
        pytest.skip("no committed figures/<preset>/REPORT.md")
    results = (site.site / "results.html").read_text()
    for preset in presets:
        fid = pd.read_csv(ROOT / "figures" / preset / "fidelity.csv")
        assert f"preset-{preset}" in results
        for claim in fid.claim:  # every claim has its row
            assert claim.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("'", "&#x27;") in results, claim
    fids = [pd.read_csv(ROOT / "figures" / p / "fidelity.csv", keep_default_na=False) for p in presets]
    adapted = sum(int((f.get("adapted_verdict", pd.Series(dtype=str)) != "").sum()) for f in fids)
    assert results.count('class="depthnb-verdict ') == sum(len(f) for f in fids) + adapted  # the adapted ones under theirs
    assert results.count('class="depthnb-adapted"') == adapted
    # an experiment page shows the figure its code makes, linked to the full-size image, and its tables with their CSV
    pretrain = (site.site / "experiments" / "petty_pretrain.html").read_text()
    fig = f"../figures/{presets[0]}/petty_fig2_perplexity.png"
    assert f'<a href="{fig}"' in pretrain and (site.site / fig[3:]).is_file()
    assert f"../figures/{presets[0]}/pretrain_final_ppl.csv" in pretrain
    # every row states the paper's number (or why there is none); evidence is cut only at a sentence, the rest in the row
    assert results.count('<td class="depthnb-paper">') == sum(len(f) for f in fids)
    assert '<td class="depthnb-paper"></td>' not in results
    tables = re.findall(r'<table class="depthnb-verdicts">.*?</table>', results, flags=re.S)
    assert len(tables) >= len(presets) and not [t for t in tables if "\u2026" in t]
    assert 'class="depthnb-more"' in results  # the rest of a long evidence, one click away
    # each figure has one caption: the one drawn into its PNG
    assert "<figcaption" not in pretrain and 'class="depthnb-figure"' in pretrain
    # the solver's size-classes cell shows its table
    solver = (site.site / "solver.html").read_text()
    cells = [c for c in solver.split('class="cell docutils container"')
             if "pd.DataFrame(SIZE_CLASSES.values())" in re.sub(r"<[^>]+>", "", c)]
    assert len(cells) == 1 and "cell_output" in cells[0] and "<table" in cells[0] and "374M" in cells[0]
    # the claims pages show their verdicts; the planner its plans
    assert "depthnb-verdict" in (site.site / "claims_petty.html").read_text()
    assert "GPU-hours" in (site.site / "plan.html").read_text() and "depthnb-table" in (site.site / "plan.html").read_text()
    # the report as a page: its tables link to the pages that make them, no `<part>` lost as a tag
    report = (site.site / f"report-{presets[0]}.html").read_text()
    assert "experiments/petty_shapes.html#petty_table2" in report and "figures//" not in report


def test_pages_render_in_chromium(site):
    result = sitecheck.check_site(site.site, sitecheck.CHECKED_PAGES, SCREENSHOTS, chromium=CHROMIUM)
    print(f"browser check: {result.seconds:.0f} s, {len(result.pages)} pages opened, {len(result.crawled)} crawled")
    problems = result.problems(need_math=sitecheck.MATH_PAGES, need_images=("index.html",))
    assert problems == [], f"{len(problems)} problems:\n" + "\n".join(problems)
    source = ROOT / "_proc" / "_site"
    checked = {c.page: c for c in result.pages}
    for name in sitecheck.CHECKED_PAGES:
        check = checked[name]
        assert check.status == 200 and "depthnb" in check.title, check
        assert check.images >= _expected_images(source, check.page), check
        assert check.screenshot.stat().st_size > 10_000, check.screenshot
    assert set(site.pages) <= set(checked), "every page is opened in the browser"
    figures = [o for p in site_results.shown_presets(ROOT) for o in site_results.preset_outputs(ROOT, p) if o.kind == "figure"]
    assert checked["index.html"].images >= len(figures), "the home page's gallery shows every shown preset's figures"
    assert checked["experiments/petty_pretrain.html"].images > 0
    # the layout a reader sees: no verdict badge or table cut off, no caption twice, the section in view marked
    res = checked["results.html"]
    assert (res.clipped, res.empty_paper, res.cut_evidence) == ([], 0, 0), res
    assert [(c.page, c.clipped) for c in result.pages if c.clipped] == []
    assert [(c.page, c.captions_twice) for c in result.pages if c.captions_twice] == []
    assert [(c.page, c.toc) for c in result.pages if c.toc] == []
    assert result.search_results > 0


def test_home_page_height(site):
    "The home page stays a page to read, not a gallery 50,000 px tall."
    require(Path(CHROMIUM).exists(), f"{CHROMIUM} missing: apt-get install chromium")
    from playwright.sync_api import sync_playwright

    server, base = sitecheck.serve_site(site.site)
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=list(sitecheck.CHROMIUM_FLAGS[1:]), headless=True)
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(base + "index.html", wait_until="load")
            height = page.evaluate("document.documentElement.scrollHeight")
            browser.close()
    finally:
        server.shutdown()
        server.server_close()
    print(f"home page: {height} px tall")
    assert height < HOME_MAX_PX, f"the home page is {height} px tall"
