"""Benchmark `solarwm data select`'s engine on 1.43 million synthetic metric rows over the 14 owners.

    python benchmarks/policy_select.py [--rows 1430000] [--repeats 3] [--seed 0]

Prints the generation time and, separately, the evaluation time and rows/s (best of the repeats),
plus the engine on a tenth of the rows to show how it scales, and the tier counts. CPU time is
printed next to wall time because a shared machine inflates wall time.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from solarwm.data.policy import OWNERS, evaluate, load_policy

POLICY = Path(__file__).resolve().parents[1] / "recipes/policies/solarwm-v1.yaml"
TABLE3_OWNERS = [o for o in OWNERS if o != "synthetic"]
CLEAN_OWNERS = ["miradata_clean", "sekai_walking_clean", "spatialvid_clean"]
FLAGS = ["text_heavy", "watermark", "ui_overlay", "blurry", "near_static", "low_light", "nsfw", "single_color"]


def _numbers(rng: np.random.Generator, values: np.ndarray, missing: float = 0.01, nan: float = 0.005) -> pa.Array:
    """A float64 column with a fraction of nulls (not computed) and NaNs (broken metric)."""
    values = values.astype(np.float64)
    values[rng.random(len(values)) < nan] = np.nan
    return pa.array(values, pa.float64(), mask=rng.random(len(values)) < missing)


def _choice(rng: np.random.Generator, options: list[str], n: int, p: list[float] | None = None) -> pa.Array:
    indices = pa.array(rng.choice(len(options), size=n, p=p).astype(np.int32))
    return pa.DictionaryArray.from_arrays(indices, pa.array(options)).dictionary_decode()


def make_table(n: int, seed: int = 0) -> pa.Table:
    """`n` synthetic clips with realistic metric distributions, some null and some NaN. [n rows]"""
    rng = np.random.default_rng(seed)
    owner = _choice(rng, TABLE3_OWNERS, n)
    fov_x = rng.normal(65, 18, n)
    fov_y = fov_x * rng.uniform(0.5, 0.65, n)
    flag_count = rng.choice(3, size=n, p=[0.7, 0.22, 0.08])
    offsets = np.concatenate([[0], np.cumsum(flag_count)]).astype(np.int32)
    flags = pa.ListArray.from_arrays(pa.array(offsets), _choice(rng, FLAGS, int(offsets[-1])))
    flags = pc.if_else(pa.array(rng.random(n) < 0.01), pa.nulls(n, flags.type), flags)  # VLM not run
    hd = rng.random(n) < 0.85
    clean = pc.is_in(owner, value_set=pa.array(CLEAN_OWNERS)).to_numpy(zero_copy_only=False)

    def lineage(values: pa.Array) -> pa.Array:
        return pc.if_else(pa.array(clean), values, pa.nulls(n, values.type))

    columns = {
        "clip_id": pc.binary_join_element_wise("clip-", pc.cast(pa.array(np.arange(n)), pa.string()), ""),
        "owner": owner,
        "num_frames": pa.array(rng.choice([49, 81, 121, 241], size=n, p=[0.1, 0.3, 0.4, 0.2]), pa.int64()),
        "width": pa.array(np.where(hd, 1280, 1920), pa.int64()),
        "height": pa.array(np.where(hd, 720, 1080), pa.int64()),
        "caption": _choice(rng, ["", " ", "a walk through a market street at dusk",
                                 "a drone flies over a forest road", "a car drives through a rainy city"],
                           n, p=[0.02, 0.01, 0.35, 0.32, 0.30]),
        "camera.finite": pa.array(rng.random(n) > 0.005, mask=rng.random(n) < 0.005),
        "camera.fov_x_min": _numbers(rng, fov_x),
        "camera.fov_x_max": _numbers(rng, fov_x + np.abs(rng.normal(0, 4, n))),
        "camera.fov_y_min": _numbers(rng, fov_y),
        "camera.fov_y_max": _numbers(rng, fov_y + np.abs(rng.normal(0, 3, n))),
        "camera.focal_div_max": _numbers(rng, rng.exponential(0.05, n)),
        "camera.scale_cov": _numbers(rng, rng.exponential(0.4, n)),
        "metrics.vlm_quality": _numbers(rng, rng.choice(5, size=n, p=[0.03, 0.07, 0.2, 0.4, 0.3]) + 1.0, nan=0),
        "metrics.vlm_reject_flags": flags,
        "metrics.vlm_transition_count": _numbers(rng, rng.poisson(0.15, n), nan=0),
        "metrics.vlm_entity_density": _numbers(rng, rng.choice(3, size=n, p=[0.4, 0.45, 0.15]) + 1.0, nan=0),
        "metrics.dover_tech": _numbers(rng, rng.beta(5, 5, n)),
        "metrics.dover_aes": _numbers(rng, rng.beta(5, 5, n)),
        "metrics.vmaf": _numbers(rng, rng.lognormal(np.log(12), 1.0, n)),
        "metrics.unimatch": _numbers(rng, rng.lognormal(np.log(40), 0.9, n)),
        "metrics.saturation": _numbers(rng, rng.normal(100, 40, n)),
        "metrics.scene_cuts": _numbers(rng, rng.poisson(0.2, n), nan=0),
        "lineage.source_tier": lineage(_choice(rng, ["xhigh", "high", "rejected"], n, p=[0.3, 0.6, 0.1])),
        "lineage.geometry_ok": lineage(pa.array(rng.random(n) < 0.95)),
        "lineage.source_width": lineage(pa.array(np.where(rng.random(n) < 0.95, 1280, 1920), pa.int64())),
        "lineage.source_height": lineage(pa.array(np.where(rng.random(n) < 0.95, 720, 1080), pa.int64())),
    }
    return pa.table(columns)


def main() -> None:
    """Generate, evaluate, print figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_430_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    policy = load_policy(POLICY)

    start = time.perf_counter()
    table = make_table(args.rows, args.seed)
    print(f"generate: {args.rows} rows x {table.num_columns} columns in {time.perf_counter() - start:.2f} s")

    def best_time(data: pa.Table) -> tuple[float, float, object]:
        """Best wall and best CPU seconds over the repeats (CPU time is robust to a busy machine)."""
        walls, cpus, selection = [], [], None
        for _ in range(args.repeats):
            wall, cpu = time.perf_counter(), time.process_time()
            selection = evaluate(policy, data)
            walls.append(time.perf_counter() - wall)
            cpus.append(time.process_time() - cpu)
        return min(walls), min(cpus), selection

    tenth = table.slice(0, args.rows // 10)
    for data in (tenth, table):
        wall_s, cpu_s, selection = best_time(data)
        print(f"evaluate {data.num_rows} rows: wall {wall_s:.3f} s ({data.num_rows / wall_s:,.0f} rows/s), "
              f"cpu {cpu_s:.3f} s ({data.num_rows / cpu_s:,.0f} rows/cpu-s), best of {args.repeats}")
    summary = selection.summary(top=1)
    reasons = pc.list_value_length(selection.table.column("reasons"))
    print(f"tiers: {summary['tiers']}; reasons: {pc.sum(reasons).as_py():,} "
          f"(max {pc.max(reasons).as_py()} on one clip)")


if __name__ == "__main__":
    main()
