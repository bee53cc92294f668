"""Words the chapters' prose reads off a build's numbers, where more than one chapter needs them."""

import numpy as np


def course(values):
    """How a sequence moves from each value to the next: +1 where it rises at every step, -1
    where it falls at every step, 0 otherwise; None for fewer than two values."""
    values = np.asarray(list(values), dtype=float)
    if len(values) < 2:
        return None
    steps = np.diff(values)
    return 1 if (steps > 0).all() else -1 if (steps < 0).all() else 0


def size_list(values):
    """Sizes in words: "256 to 4096 in steps of 256" where three or more are evenly spaced,
    else each of them, "64, 128, 256"."""
    values = [int(v) for v in values]
    steps = set(np.diff(values).tolist())
    if len(values) >= 3 and len(steps) == 1:
        return f"{values[0]} to {values[-1]} in steps of {steps.pop()}"
    return ", ".join(map(str, values))


def share_range(shares):
    """Shares in words: "47%" where they round alike, else "45% to 49%"."""
    low, high = f"{min(shares):.0%}", f"{max(shares):.0%}"
    return low if low == high else f"{low} to {high}"


def id_list(ids):
    """Row ids in words: "a, b and c", or "none"."""
    ids = list(ids)
    if not ids:
        return "none"
    return ids[0] if len(ids) == 1 else ", ".join(ids[:-1]) + " and " + ids[-1]


def signed_span(differences, reference, none):
    """Relative differences from ``reference`` in words: "lies 43% to 78% above the formula's",
    "... below ...", or "lies 2% to 9% off the formula's, above it at some cells and below it
    at others"; ``none`` where there are no differences."""
    differences = np.asarray(differences, dtype=float).ravel()
    if differences.size == 0:
        return none
    span = share_range(np.abs(differences))
    if (differences > 0).all() or (differences < 0).all():
        side = "above" if differences[0] > 0 else "below"
        return f"lies {span} {side} {reference}"
    return f"lies {span} off {reference}, above it at some cells and below it at others"
