"""toycore: the thin library behind the book on toy models of superposition.

Data, models and the training loop are shared by every chapter; `theory`, `experiments` and
`plots` hold one module per chapter; `claims`, `widgets` and `book` turn results into the book.
"""
__version__ = "0.1.0"
