"""toycore: the thin library behind the book on toy models of superposition.

Data, models and the training loop are shared by every chapter; `theory`, `experiments` and
`plots` hold one module per chapter; `claims`, `widgets` and `book` turn results into the book.
`devices` says where tensors live, `shards` runs a sweep's pieces in-process or on a Dask
cluster, `cache` keeps every result, and `records` keeps the paper profile's verdicts.
"""

__version__ = "0.1.0"
# First, before any computing module: the cache reads the source of the code this process runs.
from . import cache  # noqa: E402,F401
from .allocator import keep_freed_memory  # noqa: E402

# Before any training: freed memory stays with the process for the next step's temporaries.
keep_freed_memory()
