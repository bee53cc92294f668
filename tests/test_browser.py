"""The `ci` book in a real browser, with no network: Debian's Chromium driven by Playwright.

The built HTML is served from 127.0.0.1, and also opened straight from disk (file://); every
request to any other host is refused, as for a reader offline. Each page must render its math
and every widget view, each precomputed explorer's sliders must change the figure shown, and no
script may throw. A screenshot of the top of each page (what a reader sees first; the whole
of a chapter page costs seconds) is saved under _build/screenshots/.
"""

import functools
import http.server
import re
import threading
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from toycore.book import config
from toycore.experiments import relu as ex
from toycore.paths import REPO_ROOT
from toycore.theory import persian_rug as rug

SCREENSHOTS = REPO_ROOT / "_build" / "screenshots"
CHAPTER_PAGES = [f"chapters/{notebook.stem}" for notebook in config.chapters()]
PAGES = ["intro", "findings"] + CHAPTER_PAGES + ["reproducing"]
TIMEOUT_MS = 120_000  # the longest a page's load, or any wait in it, may take


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module", params=["served", "from-disk"])
def site(built, request):
    """The built HTML, served on 127.0.0.1 or opened from disk: its base URL."""
    build_dir, _ = built
    html = build_dir / "html"
    if request.param == "from-disk":
        yield html.as_uri()
        return
    handler = functools.partial(QuietHandler, directory=str(html))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


class OfflinePage:
    """A page whose requests leave 127.0.0.1 only to be refused, recording what it tried."""

    def __init__(self, browser, url):
        self.context = browser.new_context(
            viewport={"width": 1280, "height": 900}, service_workers="block"
        )
        # Playwright's 30 s for a load or a wait is too short for a chapter page on a cold,
        # loaded 2-core machine (the book build and the Binder test run beside this file).
        self.context.set_default_timeout(TIMEOUT_MS)
        self.page = self.context.new_page()
        self.errors, self.refused, self.unsettled = [], [], None
        self.page.on("pageerror", lambda error: self.errors.append(str(error)))
        self.page.route("**/*", self._route)
        self.page.goto(url, wait_until="load")

    def _route(self, route):
        url = urlsplit(route.request.url)
        if url.scheme in ("data", "blob", "file") or url.hostname == "127.0.0.1":
            route.continue_()
        else:
            self.refused.append(route.request.url)
            route.abort()

    def close(self):
        self.context.close()


@pytest.fixture(scope="module")
def pages(site, browser):
    """Each page opened once and given time for its math and widgets to settle."""
    opened = {}
    for name in PAGES:
        page = OfflinePage(browser, f"{site}/{name}.html")
        views = page.page.locator('script[type="application/vnd.jupyter.widget-view+json"]').count()
        # MathJax typesets after load (pages without math do not load it); widgets draw on load
        try:
            page.page.wait_for_function(
                "!window.MathJax || (MathJax.startup && MathJax.startup.promise)"
            )
            page.page.evaluate("window.MathJax ? MathJax.startup.promise.then(() => true) : true")
            page.page.wait_for_function(
                "views => { const areas = [...document.querySelectorAll('.widget-subarea')];"
                "  return areas.length == views && areas.every(area =>"
                "    [...area.querySelectorAll('img')].some(img => img.naturalWidth > 0)); }",
                arg=views,
            )
        except PlaywrightTimeout as timeout:
            page.unsettled = str(timeout).splitlines()[0]
        opened[name] = page
    yield opened
    for page in opened.values():
        page.close()


@pytest.mark.parametrize("name", PAGES)
def test_page_needs_nothing_from_outside_and_throws_nothing(pages, name):
    page = pages[name]
    if page.page.url.startswith("http"):
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.page.screenshot(path=str(SCREENSHOTS / f"{Path(name).name}.png"))
    assert page.refused == [], f"{name}: requests left the machine: {page.refused}"
    assert page.errors == [], f"{name}: uncaught errors in the page: {page.errors}"
    assert page.unsettled is None, f"{name}: math or widgets never finished: {page.unsettled}"


# Every figure on show, in a cell's output or an explorer: its pixels and its width on screen.
FIGURE_SIZES_JS = """() => [...document.querySelectorAll('.cell_output img, .widget-subarea img')]
  .filter(img => img.offsetParent !== null && img.naturalWidth > 0)
  .map(img => [img.naturalWidth, img.getBoundingClientRect().width])"""


@pytest.mark.parametrize("name", CHAPTER_PAGES)
def test_figures_stay_sharp_on_high_density_screens(pages, name):
    sizes = pages[name].page.evaluate(FIGURE_SIZES_JS)
    assert sizes, f"{name}: no figure found"
    # a screen with 2 device pixels per CSS pixel needs twice the pixels (1 pixel of rounding)
    blurry = [(pixels, shown) for pixels, shown in sizes if pixels < 2 * shown - 1]
    assert blurry == [], f"{name}: figures with fewer than 2 pixels per CSS pixel: {blurry}"


# Text outside code, scripts and typeset math: what a reader sees as prose.
VISIBLE_PROSE_JS = """() => {
  const walker = document.createTreeWalker(document.querySelector('main') || document.body,
                                           NodeFilter.SHOW_TEXT);
  const parts = [];
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    if (!node.parentElement.closest('pre, code, script, style, mjx-container, .highlight')) {
      parts.push(node.textContent);
    }
  }
  return parts.join(' ');
}"""


@pytest.mark.parametrize("name", CHAPTER_PAGES)
def test_math_is_typeset_and_no_tex_is_left_raw(pages, name):
    page = pages[name].page
    formulas = page.locator("main .math").count()
    assert formulas > 0, f"{name}: no formulas on the page"
    typeset = page.locator("main .math mjx-container").count()
    assert typeset == formulas, f"{name}: {formulas - typeset} of {formulas} formulas not typeset"
    assert page.locator("mjx-merror").count() == 0, f"{name}: MathJax reports a TeX error"
    prose = page.evaluate(VISIBLE_PROSE_JS)
    raw = re.findall(r"\$[^$\n]{1,80}\$|\\\(|\\\[|\\begin\{", prose)
    assert raw == [], f"{name}: TeX left raw in the page: {raw[:5]}"


# The src of the one image a reader sees in a widget area (a message when there is not one).
VISIBLE_FIGURE_JS = """area => {
  const shown = [...area.querySelectorAll('img')].filter(img => {
    const box = img.getBoundingClientRect();
    return img.offsetParent !== null && box.width > 0 && box.height > 0 && img.naturalWidth > 0;
  });
  return shown.length === 1 ? shown[0].src : `${shown.length} images shown`;
}"""


def visible_figure(area):
    return area.evaluate(VISIBLE_FIGURE_JS)


@pytest.mark.parametrize("name", CHAPTER_PAGES)
def test_every_widget_view_renders(pages, name):
    page = pages[name].page
    views = page.locator('script[type="application/vnd.jupyter.widget-view+json"]').count()
    areas = page.locator(".widget-subarea")
    assert views >= 1 and areas.count() == views, (
        f"{name}: {areas.count()} of {views} views rendered"
    )
    in_page = page.locator(".toycore-inpage")  # widgets the page's own script builds
    assert views + in_page.count() >= 2, f"{name}: too few explorers"
    for widget in in_page.all():
        assert widget.get_attribute("data-mounted") == "true", f"{name}: {widget} not built"
        pictures = widget.locator("canvas").all()
        assert pictures and all(p.bounding_box()["height"] > 100 for p in pictures)
    for index in range(views):
        area = areas.nth(index)
        box = area.bounding_box()
        assert box and box["height"] > 100, f"{name}: widget {index} is empty"
        assert visible_figure(area).startswith("blob:"), f"{name}: widget {index} shows no figure"
        assert area.locator(".widget-slider, .widget-dropdown").count() >= 1, (
            f"{name}: widget {index} has no controls"
        )


def drag_to_end(page, slider):
    """Drag a slider's handle to the end of its track, as a reader would."""
    handle = slider.locator(".noUi-handle").first
    track = slider.locator(".noUi-target").first.bounding_box()
    start = handle.bounding_box()
    page.mouse.move(start["x"] + start["width"] / 2, start["y"] + start["height"] / 2)
    page.mouse.down()
    page.mouse.move(track["x"] + track["width"], start["y"] + start["height"] / 2, steps=8)
    page.mouse.up()


@pytest.mark.parametrize("name", CHAPTER_PAGES)
def test_each_precomputed_slider_changes_the_figure(pages, name):
    page = pages[name].page
    areas = page.locator(".widget-subarea")
    explorers = [
        areas.nth(i) for i in range(areas.count()) if areas.nth(i).locator("button").count() == 0
    ]  # live explorers have a Run button
    assert explorers, f"{name}: no precomputed explorer"
    for explorer in explorers:
        explorer.scroll_into_view_if_needed()
        sliders = explorer.locator(".widget-slider")
        assert sliders.count() >= 1
        for index in range(sliders.count()):
            before = visible_figure(explorer)
            drag_to_end(page, sliders.nth(index))
            page.wait_for_function(
                f"([area, before]) => ({VISIBLE_FIGURE_JS})(area) !== before",
                arg=[explorer.element_handle(), before],
                timeout=30_000,  # the page swaps a precomputed figure in: a loaded machine lags
            )
            after = visible_figure(explorer)
            assert after.startswith("blob:") and after != before, (
                f"{name}: slider {index} did not change the figure ({before} -> {after})"
            )


def in_page_widget(page, kind):
    """The page's one in-page widget of ``kind``, scrolled into view."""
    widget = page.locator(f'.toycore-inpage[data-kind="{kind}"]')
    assert widget.count() == 1, f"{widget.count()} in-page widgets of kind {kind!r}"
    widget.scroll_into_view_if_needed()
    return widget


def set_controls(widget, **values):
    """Set controls by name, as a reader's drag ends: an input event, then a change event."""
    for name, value in values.items():
        widget.locator(f'[name="{name}"]').evaluate(
            "(control, value) => { control.value = value;"
            "  for (const kind of ['input', 'change']) control.dispatchEvent(new Event(kind)); }",
            str(value),
        )


def pictures(widget):
    return widget.evaluate("root => [...root.querySelectorAll('canvas')].map(c => c.toDataURL())")


def train_in_page(page, widget, **values):
    """Set the controls, press Train and wait for the last step: the page's trained model."""
    set_controls(widget, **values)
    widget.locator("button", has_text="Train").click()
    page.wait_for_function(
        "root => root.toycore.state === 'done'", arg=widget.element_handle(), timeout=180_000
    )
    return widget.evaluate("root => root.toycore")


def test_chapter_2_trains_the_pentagon_and_the_orthogonal_pair_in_the_page(pages):
    page = pages["chapters/02_relu_output_model"]
    widget = in_page_widget(page.page, "relu")
    before = pictures(widget)
    # the introductory figure's sparsest panel, and its dense one (Elhage et al.)
    sparse = train_in_page(page.page, widget, n=5, m=2, S=0.95, decay=0.9, seed=0)
    after = pictures(widget)
    assert all(a != b for a, b in zip(before, after)), "training left a picture unchanged"
    W = np.array(sparse["W"]).reshape(2, 5)
    norms = np.linalg.norm(W, axis=0)
    assert ex.planar_shape(W) == "pentagon", f"not a pentagon: |W_i| {norms}, W {W}"
    assert np.abs(norms - 1).max() < 0.2
    dense = train_in_page(page.page, widget, S=0)
    assert ex.planar_shape(np.array(dense["W"]).reshape(2, 5)) == "orthogonal pair"
    again = train_in_page(page.page, widget, S=0.95)
    assert again["W"] == sparse["W"], "the same seed and settings must give the same model"
    assert page.errors == [], f"uncaught errors in the page: {page.errors}"


def test_chapter_5_builds_the_notebooks_rug_in_the_page(pages):
    page = pages["chapters/05_persian_rug"]
    widget = in_page_widget(page.page, "rug")
    before = pictures(widget)
    set_controls(widget, ns=64, ratio=0.5, seed=3)
    built = widget.evaluate("root => root.toycore")
    assert all(a != b for a, b in zip(before, pictures(widget))), "a picture did not change"
    W_in, _, rows = rug.persian_rug(64, 32, 3)
    assert (built["ns"], built["nd"], built["rows"]) == (64, 32, rows.tolist())
    assert np.array_equal(np.array(built["Win"]).reshape(32, 64), W_in)
    assert page.errors == [], f"uncaught errors in the page: {page.errors}"
