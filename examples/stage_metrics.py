"""`solarwm test` for each stage of examples/three_stages.sh: writes OUT/metrics.json and prints the table.

    python examples/stage_metrics.py OUT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from solarwm.train_cli import SolarCLI

STAGES = {"stage1": "tiny_bid", "stage2": "tiny_tf", "stage3": "tiny_dmd"}
COLUMNS = ("psnr", "psnr_static", "psnr_wrong_camera", "ssim", "cam_rot_err_deg", "cam_rot_err_deg_gt",
           "cam_rot_err_deg_median", "cam_rot_err_deg_median_gt")


def stage_metrics(out: Path, stage: str, recipe: str) -> dict[str, float]:
    """Run `solarwm test` on the stage's last checkpoint; the `test/` metrics without their prefix."""
    cli = SolarCLI(args=["test", "--config", str(out / "recipes" / f"{recipe}.yaml"),
                         "--ckpt_path", str(out / stage / "last.ckpt"), "--trainer.logger", "false"])
    metrics = cli.trainer.callback_metrics
    return {k.removeprefix("test/"): round(float(v), 4) for k, v in metrics.items() if k.startswith("test/")}


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "outputs/three_stages")
    results = {stage: stage_metrics(out, stage, recipe) for stage, recipe in STAGES.items()}
    (out / "metrics.json").write_text(json.dumps(results, indent=2) + "\n")
    print(f"\n{'stage':<8}" + "".join(f"{c:>{len(c) + 2}}" for c in COLUMNS))
    for stage, values in results.items():
        print(f"{stage:<8}" + "".join(f"{values.get(c, float('nan')):>{len(c) + 2}.3f}" for c in COLUMNS))
    print(f"\nwrote {out / 'metrics.json'}")


if __name__ == "__main__":
    main()
