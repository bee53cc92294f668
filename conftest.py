"""Test-wide settings, also inherited by nbval's kernels: the `ci` profile, no progress bars,
and a build folder of the tests' own, so that running the chapters under nbval never
overwrites the claims ledgers of a book built with `make book`."""
import os

from toycore.paths import REPO_ROOT

os.environ.setdefault("TOYCORE_PROFILE", "ci")
os.environ["TOYCORE_PROGRESS"] = "0"
os.environ["TOYCORE_BUILD_DIR"] = str(REPO_ROOT / "_build" / "tests")
