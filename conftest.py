"""Test-wide settings: the `ci` profile and no progress bars, also for nbval's kernels."""
import os

os.environ.setdefault("TOYCORE_PROFILE", "ci")
os.environ["TOYCORE_PROGRESS"] = "0"
