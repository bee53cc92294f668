"""The book's three kinds of explorer.

- ``precomputed_explorer``: every figure is rendered when the notebook runs; sliders are
  ``jslink``ed to a ``Stack`` of images, so the explorer works in the static HTML with no kernel.
- ``live_explorer``: controls and a Run button that recompute the figure; needs a kernel
  (Binder, local). The figure is an ``Image`` widget, not an ``Output`` widget: when papermill
  (nbclient) executes a cell that displays into an ``Output`` widget it sends widget state back
  to the kernel on the channel it is polling for the cell's reply, and now and then never sees
  the reply (jupyter/nbclient#312): chapter 5's build hung on such a cell in two runs of six.
- ``in_page``: a model built or trained by the page itself, in JavaScript (``inpage.js``), with
  no kernel: it works in the static HTML, opened from disk, and in JupyterLab.
"""

import html
import inspect
import itertools
import json
from pathlib import Path

import ipywidgets as widgets
from matplotlib.figure import Figure

from .plots import to_png


def _image(fig):
    image = widgets.Image(format="png")
    _draw(image, fig)
    return image


def _draw(image, fig):
    """Show ``fig`` in ``image`` at its CSS size (the PNG has PIXEL_RATIO times the pixels), or
    narrower on a narrow screen."""
    png, (width, _) = to_png(fig)
    image.value = png
    image.layout.width, image.layout.max_width, image.layout.height = f"{width}px", "100%", "auto"


def precomputed_explorer(render, **axes):
    """Render ``render(**values)`` for every combination of one or two slider axes.

    axes: ``name=[values...]``, one or two of them. Returns a VBox of sliders above the figure.
    """
    if not 1 <= len(axes) <= 2:
        raise ValueError(f"precomputed_explorer takes one or two axes; got {len(axes)}")
    for name, values in axes.items():
        if len(values) < 1:
            raise ValueError(f"axis {name!r} has no values")
    names = list(axes)
    sliders = [
        widgets.SelectionSlider(
            options=[(str(v), v) for v in axes[name]], description=name, continuous_update=True
        )
        for name in names
    ]
    frames = {
        combo: _image(render(**dict(zip(names, combo))))
        for combo in itertools.product(*axes.values())
    }
    if len(names) == 1:
        stack = widgets.Stack([frames[(v,)] for v in axes[names[0]]], selected_index=0)
        widgets.jslink((sliders[0], "index"), (stack, "selected_index"))
    else:
        inner = [
            widgets.Stack([frames[(a, b)] for b in axes[names[1]]], selected_index=0)
            for a in axes[names[0]]
        ]
        for child in inner:
            widgets.jslink((sliders[1], "index"), (child, "selected_index"))
        stack = widgets.Stack(inner, selected_index=0)
        widgets.jslink((sliders[0], "index"), (stack, "selected_index"))
    return widgets.VBox([widgets.HBox(sliders), stack])


def live_explorer(function, **controls):
    """Controls for ``function``'s parameters and a Run button; ``function`` returns a Figure.

    controls: ``name=abbreviation`` as for ``interact`` ((min, max, step) for a slider, a list
    for a dropdown); the start values are ``function``'s defaults. A button rather than live
    controls: recomputing may take a few seconds. The first figure is drawn at once, so the
    static page shows a real result. Returns a VBox: controls and button above the image.
    """
    defaults = inspect.signature(function).parameters
    inputs = {}
    for name, abbreviation in controls.items():
        default = defaults[name].default if name in defaults else inspect.Parameter.empty
        control = widgets.interactive.widget_from_abbrev(abbreviation, default)
        if control is None:
            raise ValueError(f"cannot make a control for {name!r} from {abbreviation!r}")
        control.description = name
        inputs[name] = control
    image = widgets.Image(format="png")
    button = widgets.Button(description="Run")

    def run(_=None):
        fig = function(**{name: control.value for name, control in inputs.items()})
        if not isinstance(fig, Figure):
            raise TypeError(f"live_explorer's function must return a Figure; got {type(fig)}")
        _draw(image, fig)

    button.on_click(run)
    run()
    row = widgets.HBox([*inputs.values(), button], layout=widgets.Layout(flex_flow="row wrap"))
    return widgets.VBox([row, image])


# The in-page widgets' code, one small file of the package.
IN_PAGE_SCRIPT = Path(__file__).with_name("inpage.js")
IN_PAGE_KINDS = ("relu", "rug")


class InPage:
    """An in-page widget: a <div> with its settings, then ``inpage.js`` inline, which builds the
    controls and pictures into it. Inline, not a file beside the page, so that the same output
    works in the static book (opened from disk too) and in JupyterLab."""

    def __init__(self, kind, settings, elsewhere):
        if kind not in IN_PAGE_KINDS:
            raise ValueError(f"in-page widgets are {IN_PAGE_KINDS}; got {kind!r}")
        self.kind, self.settings = kind, json.loads(json.dumps(settings))  # fails if not JSON
        self.elsewhere = elsewhere  # what a reader whose page runs no script can use instead

    def _repr_html_(self):
        script = IN_PAGE_SCRIPT.read_text()
        if "</script" in script.lower():
            raise ValueError(f"{IN_PAGE_SCRIPT.name} must not contain '</script'")
        return (
            f'<div class="toycore-inpage" data-kind="{self.kind}" '
            f'data-settings="{html.escape(json.dumps(self.settings))}">'
            "<p>This widget runs in the page's own JavaScript, which has not run here (the "
            f"HTML book runs it). {html.escape(self.elsewhere)}</p></div>"
            f"<script>{script}</script>"
        )


def relu_trainer(*, n, m, S, decay, seed, lr, steps, batch):
    """The ReLU output model trained in the page: controls n (up to 20), m (up to 5), S, decay and
    seed start at these values; AdamW with ``lr``, ``steps`` and ``batch`` as the chapter's."""
    if not (2 <= n <= 20 and 1 <= m <= 5 and 0 <= S < 1 and 0.5 <= decay <= 1):
        raise ValueError(
            f"the page trains 2 <= n <= 20, 1 <= m <= 5, 0 <= S < 1, decay in "
            f"[0.5, 1]; got n={n}, m={m}, S={S}, decay={decay}"
        )
    settings = dict(n=n, m=m, S=S, decay=decay, seed=seed, lr=lr, steps=steps, batch=batch)
    return InPage("relu", settings, "With a kernel, the live explorer below trains the model.")


def rug_builder(*, features, ns, ratio, seed):
    """The Persian rug built in the page for ns in ``features`` (powers of 2), a ratio nd/ns and
    a seed: the same rows, so the same rug, as ``toycore.theory.persian_rug.persian_rug``."""
    if ns not in features or any(f & (f - 1) for f in features):
        raise ValueError(f"ns must be one of the powers of 2 in {features}; got {ns}")
    elsewhere = "With a kernel, plots.rug(W_out @ W_in) of th.persian_rug(ns, nd, seed) draws it."
    return InPage("rug", dict(features=list(features), ns=ns, ratio=ratio, seed=seed), elsewhere)
