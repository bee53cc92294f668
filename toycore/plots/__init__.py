"""One plotting style for the whole book, and helpers to turn figures into PNG bytes."""

import io
import struct

import matplotlib
import matplotlib.pyplot as plt
import numpy as np

STYLE = {
    "figure.dpi": 100,  # CSS pixels per inch: the size a figure is shown at
    "font.size": 10,
    "axes.titlesize": 10,
    "axes.labelsize": 10,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "legend.frameon": False,
    "legend.fontsize": 8,
    "lines.linewidth": 1.5,
    "image.cmap": "RdBu_r",
}


# Applied on import: rcParams are read when artists are drawn, not only when axes are made.
matplotlib.rcParams.update(STYLE)


def label_log_axis(ax, values, closest=1.4):
    """Tick a log x axis at ``values`` (the sizes a figure ran), and nowhere else: the axis's
    own minor labels (6×10¹ beside 64) would overprint them. Where two neighbours lie within a
    factor ``closest`` of each other (sizes stepped linearly, as the authors' Figure 3 steps m
    by 256 up to 4096), only the first size's doublings carry a label, so that none overlap."""
    values = sorted(values)
    crowded = any(high / low < closest for low, high in zip(values, values[1:]))
    labels = [str(v) if not crowded or np.log2(v / values[0]).is_integer() else "" for v in values]
    ax.set_xticks(values, labels)
    ax.minorticks_off()


def figure(ncols=1, nrows=1, width=4.2, height=3.2, **kwargs):
    """A new figure in the book's style: panels of ``width`` x ``height`` inches each."""
    return plt.subplots(
        nrows, ncols, figsize=(width * ncols, height * nrows), layout="constrained", **kwargs
    )


# Figures are rendered with this many pixels per CSS pixel and shown at their CSS size, so that
# they stay sharp on high-density screens (most phones and laptops have 2 or more).
PIXEL_RATIO = 2


def show(fig):
    """Display ``fig`` once, sharp on high-density screens, and close it, so that Jupyter does
    not also show it at the cell's end."""
    from IPython.display import Image, display

    png, (width, height) = to_png(fig, tight=True)
    display(Image(data=png, format="png", width=width, height=height))


# Where myst-nb's {glue:text} role looks for a value that a cell recorded without showing it.
GLUE_PREFIX = "application/papermill.record/"


def glue(**values):
    """Hand numbers (or words) to the chapter's prose, which quotes them as
    {glue:text}`name:.2f`: the page then states what this build measured, in every profile.
    Each is recorded as myst-nb's ``glue(name, value, display=False)`` records it, written here
    so that a kernel without myst-nb (Binder's) runs the chapters too. NumPy scalars become
    Python ones, whose text myst-nb reads back as numbers."""
    from IPython.core.formatters import format_display_data
    from IPython.display import display

    for name, value in values.items():
        value = value.item() if isinstance(value, np.generic) else value
        bundle, metadata = format_display_data(value)
        metadata["scrapbook"] = dict(name=name, mime_prefix=GLUE_PREFIX)
        display(
            {GLUE_PREFIX + kind: data for kind, data in bundle.items()}, raw=True, metadata=metadata
        )


def power_of_ten(x):
    """The order of magnitude of ``x`` for prose: 1.3e8 -> '10⁸'."""
    return "10" + str(round(np.log10(x))).translate(str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹"))


def to_png(fig, tight=False):
    """The figure as PNG bytes at PIXEL_RATIO times its resolution, and the (width, height) in
    CSS pixels to show it at; the figure is closed, so that it is not also shown inline.
    tight: crop to the drawn area, as Jupyter's inline figures are (explorer frames are not
    cropped, so that they keep one size from frame to frame)."""
    buffer = io.BytesIO()
    fig.savefig(
        buffer,
        format="png",
        dpi=fig.dpi * PIXEL_RATIO,
        bbox_inches="tight" if tight else None,
    )
    plt.close(fig)
    png = buffer.getvalue()
    width, height = struct.unpack(">II", png[16:24])  # the IHDR chunk: the size in pixels
    return png, (round(width / PIXEL_RATIO), round(height / PIXEL_RATIO))
