#!/usr/bin/env bash
# The "stage 2 past the window" lever of the long-horizon measures: stage 2 teacher-forced on 81-frame clips
# (recipes/tiny_tf_long.yaml), stage 3 from it on the tiny chain's 17-frame clips (recipes/tiny_dmd.yaml, the
# shipped base as teacher), then the three long-horizon figures of docs/results/2026-12-long-horizon.md for it:
#   bash examples/long_horizon_lever.sh OUT [TF_STEPS] [DMD_STEPS]
# OUT/truth and OUT/test_multiview cache the rendered truths (reused across runs). About 1.5 hours on 2 CPU cores.
set -euo pipefail
out=${1:?usage: long_horizon_lever.sh OUT [TF_STEPS] [DMD_STEPS]}
tf_steps=${2:-1200}
dmd_steps=${3:-240}
mkdir -p "$out"
solarwm fit --config recipes/tiny_tf_long.yaml --root "$out" --trainer.max_steps "$tf_steps"
solarwm fit --config recipes/tiny_dmd.yaml --root "$out" --trainer.max_steps "$dmd_steps" \
  --trainer.default_root_dir "$out/stage3_after_long" \
  --model.init_args.init_from.generator "$out/stage2_long/adapter" \
  --model.init_args.init_from.score recipes/weights/tiny_base4
student="$out/stage3_after_long/adapter"
python benchmarks/long_horizon.py "$student" --worlds 12 --cache "$out/truth" \
  --strip "$out/long_horizon_strip.png" --json "$out/long_horizon.json"
python benchmarks/camera_top1.py "$student" --dir "$out/test_multiview" --json "$out/camera_top1.json"
solarwm test --config recipes/tiny_dmd.yaml --root "$out" --model.init_args.init_from.generator "$student" \
  --model.init_args.init_from.score recipes/weights/tiny_base4 --data.init_args.test_multiview_dir null \
  --data.init_args.test_multiview null --trainer.logger false --trainer.enable_progress_bar false
