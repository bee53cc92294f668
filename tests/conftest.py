import pytest

from toycore import book


@pytest.fixture(scope="session")
def built(tmp_path_factory):
    """The whole book built once in the `ci` profile: (build folder, index.html)."""
    build_dir = tmp_path_factory.mktemp("book")
    index = book.build("ci", build_dir, log=lambda message: None)
    return build_dir, index
