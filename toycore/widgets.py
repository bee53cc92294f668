"""The book's two kinds of explorer.

- ``precomputed_explorer``: every figure is rendered when the notebook runs; sliders are
  ``jslink``ed to a ``Stack`` of images, so the explorer works in the static HTML with no kernel.
- ``live_explorer``: ``interactive`` controls that recompute; needs a kernel (Binder, local).
"""
import functools
import itertools

import ipywidgets as widgets
import matplotlib.pyplot as plt
from IPython.display import display
from matplotlib.figure import Figure

from .plots import to_png


def _image(fig):
    return widgets.Image(value=to_png(fig), format="png", layout=widgets.Layout(width="auto"))


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
    sliders = [widgets.SelectionSlider(options=[(str(v), v) for v in axes[name]], description=name,
                                       continuous_update=True) for name in names]
    frames = {combo: _image(render(**dict(zip(names, combo))))
              for combo in itertools.product(*axes.values())}
    if len(names) == 1:
        stack = widgets.Stack([frames[(v,)] for v in axes[names[0]]], selected_index=0)
        widgets.jslink((sliders[0], "index"), (stack, "selected_index"))
    else:
        inner = [widgets.Stack([frames[(a, b)] for b in axes[names[1]]], selected_index=0)
                 for a in axes[names[0]]]
        for child in inner:
            widgets.jslink((sliders[1], "index"), (child, "selected_index"))
        stack = widgets.Stack(inner, selected_index=0)
        widgets.jslink((sliders[0], "index"), (stack, "selected_index"))
    return widgets.VBox([widgets.HBox(sliders), stack])


def live_explorer(function, **controls):
    """``interactive(function, **controls)`` that recomputes when the user clicks Run.

    ``function`` returns a matplotlib Figure. A button rather than live sliders: retraining takes
    a second or two. The first figure is drawn at once, so the static page shows a real result.
    """
    @functools.wraps(function)  # interactive reads the defaults from the signature
    def show(**values):
        fig = function(**values)
        if not isinstance(fig, Figure):
            raise TypeError(f"live_explorer's function must return a Figure; got {type(fig)}")
        display(fig)
        plt.close(fig)

    explorer = widgets.interactive(show, {"manual": True, "manual_name": "Run"}, **controls)
    explorer.update()
    return explorer
