"""Does TF32 move a verdict? Chapter 5 executed twice in one profile, its matrix products once in
float32 and once with their inputs rounded to TensorFloat-32's 10-bit mantissa (on a CPU, which
has no TF32 products, the rounding is emulated: ``toycore.devices.matmul_operand``), and the two
ledgers compared row by row.

    .venv/bin/python benchmarks/tf32_verdicts.py --profile cpu

Prints every row whose verdict differs, and the largest relative change of a measured value;
ends with the decision: TF32 is allowed on a GPU (``make paper-gpu MATMUL=tf32``) only if no
verdict moves. Each side is a build folder of its own, with a result cache of its own (the
precision is in the cache key anyway), and ``--float32`` reuses a build already made.
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from toycore.claims import outside


def execute(folder, profile, chapter, precision):
    """Execute ``chapter`` in ``profile`` into the build folder ``folder``: its ledger."""
    ledger = Path(folder) / "claims" / f"{chapter}.json"
    if not ledger.exists():
        environment = {**os.environ, "TOYCORE_MATMUL": precision}
        environment["TOYCORE_CACHE"] = str(Path(folder) / "cache")
        command = [sys.executable, "-m", "toycore.book", "--profile", profile, "--chapters"]
        subprocess.run([*command, chapter, "--build-dir", str(folder)], env=environment, check=True)
    return {row["id"]: row for row in json.loads(ledger.read_text())}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--chapter", default="05_persian_rug")
    parser.add_argument("--float32", default="_build/tf32/float32", help="its build folder")
    parser.add_argument("--tf32", default="_build/tf32/tf32", help="its build folder")
    args = parser.parse_args()
    plain = execute(args.float32, args.profile, args.chapter, "float32")
    rounded = execute(args.tf32, args.profile, args.chapter, "tf32")
    moved, largest = [], (0.0, None)
    for claim_id, row in plain.items():
        other = rounded.get(claim_id)
        if other is None:
            moved.append(f"{claim_id}: not made with TF32")
            continue
        if row["passed"] != other["passed"] and not (outside(row) and outside(other)):
            moved.append(
                f"{claim_id}: {row['measured']:.5g} ({'holds' if row['passed'] else 'fails'}) "
                f"against {other['measured']:.5g} with TF32"
            )
        scale = max(abs(row["measured"]), 1e-6)  # a residual near 0 is noise either way
        change = abs(other["measured"] - row["measured"]) / scale
        if change > largest[0]:
            largest = (change, claim_id)
    print(f"{len(plain)} rows of {args.chapter} in the {args.profile} profile")
    print(f"largest relative change of a measured value: {largest[0]:.2e} ({largest[1]})")
    for line in moved:
        print("verdict moved:", line)
    print("TF32 allowed: no verdict moves" if not moved else "TF32 not allowed")
    return 1 if moved else 0


if __name__ == "__main__":
    sys.exit(main())
