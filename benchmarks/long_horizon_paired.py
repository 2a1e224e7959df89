"""Two models' one-minute figures compared world by world (paired 95% bootstrap intervals over worlds).

Reads two ``benchmarks/long_horizon.py --json`` outputs measured on the same worlds (same seed, count and cache) and
prints, for A minus B: the worst window's gap to the first frame repeated (from 5 s on), the mean gap from 5 s on,
and the share of (world, window) pairs with the detail ratio in [0.6, 1.6]:

    python benchmarks/long_horizon_paired.py A.json B.json
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from solarwm.metrics.long_horizon import in_band_fraction, paired_difference


def main() -> None:
    """Print A − B with paired intervals; exit 2 on files that cannot be compared."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a")
    parser.add_argument("b")
    args = parser.parse_args()
    runs = []
    for path in (args.a, args.b):
        try:
            with open(path) as f:
                r = json.load(f)
            runs.append((np.asarray(r["per_world_gap"]), np.asarray(r["per_world_detail_ratio"]), r["command"]))
        except (OSError, ValueError, KeyError) as e:
            print(f"long_horizon_paired: {path}: not a long_horizon.py --json output ({e})", file=sys.stderr)
            sys.exit(2)
    (gap_a, ratio_a, cmd_a), (gap_b, ratio_b, cmd_b) = runs
    same = ("seed", "worlds", "frames", "fps", "motion")
    if any(cmd_a.get(k) != cmd_b.get(k) for k in same) or gap_a.shape != gap_b.shape:
        print("long_horizon_paired: the two runs were measured on different worlds", file=sys.stderr)
        sys.exit(2)
    rows = [
        ("worst window from 5 s on (dB)", gap_a[:, 1:], gap_b[:, 1:], lambda g: g.mean(0).min()),
        ("mean gap from 5 s on (dB)", gap_a[:, 1:], gap_b[:, 1:], lambda g: g.mean()),
        ("pairs with detail in [0.6, 1.6]", ratio_a, ratio_b, in_band_fraction),
    ]
    print(f"A = {cmd_a.get('adapter')}\nB = {cmd_b.get('adapter')}\n{gap_a.shape[0]} worlds, A − B [95% paired]:")
    for name, a, b, statistic in rows:
        diff, low, high = paired_difference(a, b, statistic)
        print(f"  {name}: {diff:+.3f} [{low:+.3f}, {high:+.3f}]")


if __name__ == "__main__":
    main()
