import html
import json
import re
import struct

import ipywidgets as widgets
import pytest
from ipywidgets.widgets.widget import _instances
from ipywidgets.widgets.widget_link import Link

from toycore.plots import PIXEL_RATIO, figure, to_png
from toycore.widgets import (
    IN_PAGE_SCRIPT,
    live_explorer,
    precomputed_explorer,
    relu_trainer,
    rug_builder,
)


def _render(**values):
    fig, ax = figure()
    ax.set_title(repr(sorted(values.items())))
    ax.plot([0, 1], [0, sum(values.values())])
    return fig


def test_one_slider_explorer_links_slider_to_stack():
    box = precomputed_explorer(_render, a=[1, 2, 3])
    (slider,), stack = box.children[0].children, box.children[1]
    assert isinstance(stack, widgets.Stack) and len(stack.children) == 3
    assert all(isinstance(c, widgets.Image) and c.value[:4] == b"\x89PNG" for c in stack.children)
    assert len({c.value for c in stack.children}) == 3  # a different figure per value
    link = [w for w in _instances.values() if isinstance(w, Link) and w.source == (slider, "index")]
    assert link and link[0].target == (stack, "selected_index")


def test_two_slider_explorer_nests_stacks():
    box = precomputed_explorer(_render, a=[1, 2], b=[10, 20, 30])
    outer = box.children[1]
    assert len(outer.children) == 2 and all(len(s.children) == 3 for s in outer.children)


def test_explorer_rejects_bad_axes():
    with pytest.raises(ValueError, match="one or two axes"):
        precomputed_explorer(_render, a=[1], b=[2], c=[3])
    with pytest.raises(ValueError, match="no values"):
        precomputed_explorer(_render, a=[])


def test_live_explorer_draws_at_once_and_on_demand_into_an_image():
    seen = []

    def function(n=2, kind="a"):
        seen.append((n, kind))
        return _render(n=n)

    explorer = live_explorer(function, n=(1, 5), kind=["a", "b"])
    (slider, dropdown, button), image = explorer.children[0].children, explorer.children[1]
    assert seen == [(2, "a")] and (slider.value, dropdown.value) == (2, "a")
    assert isinstance(image, widgets.Image) and image.value[:4] == b"\x89PNG"
    first = image.value
    slider.value = 4
    assert seen == [(2, "a")]  # nothing recomputes until Run
    button.click()
    assert seen == [(2, "a"), (4, "a")] and image.value != first
    with pytest.raises(ValueError, match="cannot make a control for 'n'"):
        live_explorer(function, n=object())


def test_figures_carry_twice_the_pixels_of_the_size_they_are_shown_at():
    png, (width, height) = to_png(_render(a=1))
    assert (width, height) == (420, 320)  # 4.2 x 3.2 inches at 100 CSS pixels per inch
    assert PIXEL_RATIO == 2 and struct.unpack(">II", png[16:24]) == (840, 640)
    frame = precomputed_explorer(_render, a=[1, 2]).children[1].children[0]
    assert frame.layout.width == "420px" and frame.layout.max_width == "100%"


def test_glue_records_what_myst_nbs_glue_records_without_needing_myst_nb(monkeypatch):
    """Binder's kernel has no myst-nb, so the chapters record their glued numbers themselves;
    the page can only show them if the record is exactly myst-nb's."""
    import IPython.display
    import myst_nb.ext.glue
    import numpy as np

    from toycore import plots

    shown = []

    def capture(*objects, **kwargs):
        shown.append((objects, kwargs))

    monkeypatch.setattr(IPython.display, "display", capture)
    monkeypatch.setattr(myst_nb.ext.glue, "ipy_display", capture)
    for value in (0.125, 12, "near ns = 117"):
        myst_nb.ext.glue.glue("x", value, display=False)
        plots.glue(x=value)
        assert shown[-1] == shown[-2]
    plots.glue(x=np.float64(0.5))  # NumPy scalars are recorded as Python numbers
    assert shown[-1][0][0] == {plots.GLUE_PREFIX + "text/plain": "0.5"}


def test_in_page_widgets_refuse_bad_settings_before_any_work():
    with pytest.raises(ValueError, match="n=30"):
        relu_trainer(n=30, m=2, S=0.9, decay=0.9, seed=0, lr=1e-2, steps=10, batch=8)
    with pytest.raises(ValueError, match="powers of 2"):
        rug_builder(features=[64, 100], ns=64, ratio=0.1, seed=0)
    with pytest.raises(ValueError, match="one of"):
        rug_builder(features=[64, 128], ns=256, ratio=0.1, seed=0)


def test_an_in_page_widget_is_its_settings_then_the_script():
    page = rug_builder(features=[64, 128], ns=64, ratio=0.5, seed=1)._repr_html_()
    found = re.search(r'data-kind="rug" data-settings="([^"]*)"', page)
    settings = json.loads(html.unescape(found.group(1)))
    assert settings == dict(features=[64, 128], ns=64, ratio=0.5, seed=1)
    assert page.index(found.group(0)) < page.index(f"<script>{IN_PAGE_SCRIPT.read_text()}</script>")
