"""Profiles: one switch that sizes every experiment in the book.

- ``ci``: tiny, for the tests; every cell, figure and ledger row still runs.
- ``cpu`` (default): reduced sizes that still show every claim on a 2-core laptop.
- ``paper``: the sizes the source texts used, for a GPU.

A notebook's ``profile`` parameter wins; otherwise the ``TOYCORE_PROFILE`` environment variable;
otherwise ``cpu``.
"""

import os
from types import SimpleNamespace

PROFILES = ("ci", "cpu", "paper")
DEFAULT_PROFILE = "cpu"


def resolve_profile(profile=None):
    """The profile to run under: the argument, else ``$TOYCORE_PROFILE``, else ``cpu``."""
    if profile is None:
        profile = os.environ.get("TOYCORE_PROFILE") or DEFAULT_PROFILE
    if profile not in PROFILES:
        raise ValueError(f"profile must be one of {', '.join(PROFILES)}; got {profile!r}")
    return profile


def select(profile, **settings_by_profile):
    """The settings for ``profile`` as attributes, nested dicts as nested attributes, e.g.
    ``select(None, ci=dict(n=4), cpu=..., paper=...)``; the chapters' tables are in
    ``toycore.sizes``.

    Every profile must be given, so that no chapter silently lacks a size for one of them.
    """
    profile = resolve_profile(profile)
    missing = [p for p in PROFILES if p not in settings_by_profile]
    unknown = [p for p in settings_by_profile if p not in PROFILES]
    if missing or unknown:
        raise ValueError(
            f"settings needed for exactly the profiles {PROFILES}; "
            f"missing {missing}, unknown {unknown}"
        )
    return SimpleNamespace(profile=profile, **_attributes(settings_by_profile[profile]))


def _attributes(settings):
    """Nested dicts as nested namespaces: ``flow=dict(n=4)`` reads ``P.flow.n``."""
    return {
        name: SimpleNamespace(**_attributes(value)) if isinstance(value, dict) else value
        for name, value in settings.items()
    }
