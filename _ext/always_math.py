"""Load MathJax on every page of the book, not only on pages with math: the navigation sidebar
shows the chapters' titles, some of which hold math ($\\ell_1$), on every page."""


def setup(app):
    app.set_html_assets_policy("always")
    return {"parallel_read_safe": True, "parallel_write_safe": True}
