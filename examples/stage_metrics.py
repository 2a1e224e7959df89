"""`solarwm test` for each stage of examples/three_stages.sh, on two motion families of unseen worlds.

    python examples/stage_metrics.py OUT

Each stage's last checkpoint generates the recipe's test worlds (``mixed``: 6-DoF walks, strafes, climbs, turns,
tilts, orbits; seed 1000) and slow pans (seed 1001), both from seeds no training stage saw. Writes
OUT/metrics.json (the pooled test metrics, the targets with 95% intervals, and every test video's record) and
prints one table per family.

Intervals: a two-level bootstrap over the test videos: resample the worlds, then each world's noise draws,
and recompute the statistic; the 2.5th and 97.5th percentiles over 2,000 resamples. A target is met only when
its whole interval clears it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from solarwm.train_cli import SolarCLI

#: OUT/<stage> -> the recipe that made it (run with ``--root OUT``, as examples/three_stages.sh ran it).
STAGES = {"stage1": "tiny_bid", "stage2": "tiny_tf", "stage3": "tiny_dmd"}
RECIPES = Path(__file__).resolve().parents[1] / "recipes"
#: motion family -> the test worlds' overrides of the recipe's ``data.test_synth`` (None: the recipe's own).
FAMILIES = {"mixed": None, "slow_pan": {"motion": "slow_pan", "seed": 1001}}
COLUMNS = ("psnr", "psnr_static", "psnr_wrong_camera", "ssim", "cam_rot_err_deg", "cam_rot_err_deg_gt",
           "cam_trans_dir_err_deg", "cam_trans_dir_err_deg_gt", "cam_pairs", "camera_top1")
RESAMPLES = 2000


def stage_test(out: Path, stage: str, recipe: str, family: str) -> tuple[dict[str, float], list[dict], list[dict]]:
    """Run `solarwm test` on the stage's last checkpoint: its ``test/`` metrics, per-video and multi-view records.

    The multi-view worlds (``test/camera_top1``) are scored with the recipe's own test family only.
    """
    args = ["test", "--config", str(RECIPES / f"{recipe}.yaml"), "--root", str(out),
            "--ckpt_path", str(out / stage / "last.ckpt"), "--trainer.logger", "false"]
    overrides = FAMILIES[family]
    if overrides is not None:
        args += ["--data.init_args.test_corpus_dir", str(out / f"test_{family}")]
        for key, value in overrides.items():
            args += [f"--data.init_args.test_synth.{key}", str(value)]
        args += ["--data.init_args.test_multiview_dir", "null", "--data.init_args.test_multiview", "null"]
    cli = SolarCLI(args=args)
    metrics = {k.removeprefix("test/"): round(float(v), 4) for k, v in cli.trainer.callback_metrics.items()
               if k.startswith("test/")}
    return metrics, cli.model.test_records, getattr(cli.model, "multiview_records", [])


def camera_top1(records: list[dict], seed: int = 0) -> dict[str, float]:
    """``test/camera_top1`` with a 95% bootstrap interval over multi-view worlds (their views resampled together)."""
    worlds: dict[int, list[bool]] = {}
    for r in records:
        worlds.setdefault(r["world"], []).append(bool(r["top1"]))
    hits = np.array([sum(v) for v in worlds.values()], dtype=float)
    views = np.array([len(v) for v in worlds.values()], dtype=float)
    rng = np.random.default_rng(seed)
    picks = rng.integers(len(hits), size=(RESAMPLES, len(hits)))
    lo, hi = np.percentile(hits[picks].sum(1) / views[picks].sum(1), [2.5, 97.5])
    return {
        "value": round(float(hits.sum() / views.sum()), 3),
        "lo": round(float(lo), 3),
        "hi": round(float(hi), 3),
        "chance": round(float(1.0 / views.mean()), 3),
        "worlds": len(hits),
        "margin_db_median": round(float(np.median([r["margin_db"] for r in records])), 3),
    }


def _by_world(records: list[dict], num_worlds: int) -> list[list[dict]]:
    """Records grouped by test world (the loader passes the N worlds in order, once per draw)."""
    return [records[w::num_worlds] for w in range(num_worlds)]


def _resample(worlds: list[list[dict]], rng: np.random.Generator) -> list[dict]:
    picked = [worlds[i] for i in rng.integers(len(worlds), size=len(worlds))]
    return [draws[j] for draws in picked for j in rng.integers(len(draws), size=len(draws))]


def _psnr_gap(records: list[dict], baseline: str) -> float:
    return float(np.mean([r["psnr"] - r[baseline] for r in records if baseline in r]))


def _trans_ratio(records: list[dict]) -> float:
    gen = [e for r in records for e in r["cam_trans_dir_err_deg"]]
    gt = [e for r in records for e in r["cam_trans_dir_err_deg_gt"]]
    return float(np.mean(gen) / np.mean(gt)) if gen and gt else float("nan")


def targets(records: list[dict], num_worlds: int, seed: int = 0) -> dict[str, dict[str, float]]:
    """Three-stage targets with bootstrap 95% intervals: PSNR gaps over both baselines, translation error / floor."""
    worlds = _by_world(records, num_worlds)
    stats = {
        "psnr_minus_static": lambda r: _psnr_gap(r, "psnr_static"),
        "psnr_minus_wrong_camera": lambda r: _psnr_gap(r, "psnr_wrong_camera"),
        "trans_dir_err_over_floor": _trans_ratio,
    }
    rng = np.random.default_rng(seed)
    draws = [_resample(worlds, rng) for _ in range(RESAMPLES)]
    result = {}
    for name, stat in stats.items():
        values = np.array([stat(d) for d in draws])
        lo, hi = np.nanpercentile(values, [2.5, 97.5])
        result[name] = {"value": round(stat(records), 3), "lo": round(float(lo), 3), "hi": round(float(hi), 3)}
    result["parallax_pairs"] = {
        "generated": sum(len(r["cam_trans_dir_err_deg"]) for r in records),
        "ground_truth": sum(len(r["cam_trans_dir_err_deg_gt"]) for r in records),
        "pairs": sum(len(r["cam_rot_err_deg"]) for r in records),
    }
    return result


def print_table(results: dict) -> None:
    """One table per motion family, then stage 3's targets with their intervals."""
    for family, stages in results.items():
        print(f"\n{family} (unseen worlds)\n{'stage':<8}" + "".join(f"{c:>{len(c) + 2}}" for c in COLUMNS))
        for stage, res in stages.items():
            values = res["metrics"]
            print(f"{stage:<8}" + "".join(f"{values.get(c, float('nan')):>{len(c) + 2}.3f}" for c in COLUMNS))
        t = stages["stage3"]["targets"]
        print(
            "stage 3, 95% intervals: "
            + "; ".join(f"{k} {v['value']:.2f} [{v['lo']:.2f}, {v['hi']:.2f}]" for k, v in t.items() if "value" in v)
            + f"; pairs with parallax (generated / ground truth / all): {t['parallax_pairs']['generated']} / "
            f"{t['parallax_pairs']['ground_truth']} / {t['parallax_pairs']['pairs']}"
        )
        top1 = stages["stage3"].get("camera_top1")
        if top1:
            print(
                f"stage 3, camera top-1 on {top1['worlds']} multi-view worlds: {top1['value']:.2f} "
                f"[{top1['lo']:.2f}, {top1['hi']:.2f}] (chance {top1['chance']:.2f}; "
                f"median margin {top1['margin_db_median']:.2f} dB)"
            )


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "outputs/three_stages")
    results: dict = {}
    for family in FAMILIES:
        results[family] = {}
        for stage, recipe in STAGES.items():
            metrics, records, multiview = stage_test(out, stage, recipe, family)
            num_worlds = len(records) // max(1, _draws(out, recipe))
            results[family][stage] = {"metrics": metrics, "targets": targets(records, num_worlds), "records": records}
            if multiview:
                results[family][stage].update(camera_top1=camera_top1(multiview), multiview_records=multiview)
    (out / "metrics.json").write_text(json.dumps(results, indent=1) + "\n")
    print_table(results)
    print(f"\nwrote {out / 'metrics.json'}")


def _draws(out: Path, recipe: str) -> int:
    from solarwm.train_cli import parse_recipe

    return int(parse_recipe(str(RECIPES / f"{recipe}.yaml"), "--root", str(out)).data.init_args.test_draws)


if __name__ == "__main__":
    main()
