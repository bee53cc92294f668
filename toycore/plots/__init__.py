"""One plotting style for the whole book, and helpers to turn figures into PNG bytes."""

import io

import matplotlib
import matplotlib.pyplot as plt

STYLE = {
    "figure.dpi": 100,
    "savefig.dpi": 100,
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


def figure(ncols=1, nrows=1, width=4.2, height=3.2, **kwargs):
    """A new figure in the book's style: panels of ``width`` x ``height`` inches each."""
    return plt.subplots(
        nrows, ncols, figsize=(width * ncols, height * nrows), layout="constrained", **kwargs
    )


def show(fig):
    """Display ``fig`` once and close it, so that Jupyter does not also show it at the cell's
    end."""
    from IPython.display import display

    display(fig)
    plt.close(fig)


def to_png(fig):
    """The figure as PNG bytes; the figure is closed so that it is not also shown inline."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return buffer.getvalue()
