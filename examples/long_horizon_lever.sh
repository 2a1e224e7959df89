#!/usr/bin/env bash
# The "stage 2 past the window" lever of the long-horizon measures: stage 2 teacher-forced on 81-frame clips
# (recipes/tiny_tf_long.yaml), stage 3 from it on the tiny chain's 17-frame clips (recipes/tiny_dmd.yaml, the
# shipped base as teacher), then the three long-horizon figures of docs/results/2026-12-long-horizon.md for it:
#   bash examples/long_horizon_lever.sh OUT [TF_STEPS] [DMD_STEPS] [FRAMES] [TF_RECIPE] [DMD_RECIPE]
# FRAMES (default 81) is stage 2's window; 17 is the control: the same worlds and chain in 17-frame windows, batch 4
# (the tokens per step of one 81-frame window). TF_RECIPE (default recipes/tiny_tf_long.yaml) is stage 2's recipe,
# e.g. recipes/tiny_tf_long_context_noise.yaml or recipes/tiny_tf_long_sink.yaml; its name tags the outputs.
# DMD_RECIPE (default recipes/tiny_dmd.yaml) is stage 3's, e.g. recipes/tiny_dmd_stream.yaml (streaming long
# tuning on one-minute clips) or recipes/tiny_dmd_stream_regression.yaml (the same with the regression term); its
# name tags stage 3's folder.
# OUT/truth and OUT/test_multiview cache the rendered truths (reused across runs). About 1.5 hours on 2 CPU cores.
set -euo pipefail
out=${1:?usage: long_horizon_lever.sh OUT [TF_STEPS] [DMD_STEPS] [FRAMES] [TF_RECIPE] [DMD_RECIPE]}
tf_steps=${2:-1200}
dmd_steps=${3:-240}
frames=${4:-81}
recipe=${5:-recipes/tiny_tf_long.yaml}
dmd_recipe=${6:-recipes/tiny_dmd.yaml}
dmd_variant=$(basename "$dmd_recipe" .yaml)
dmd_variant=${dmd_variant#tiny_dmd}  # "" for recipes/tiny_dmd.yaml, "_stream" for recipes/tiny_dmd_stream.yaml
variant=$(basename "$recipe" .yaml)
variant=${variant#tiny_tf_long}  # "" for the plain lever, "_context_noise" for recipes/tiny_tf_long_context_noise.yaml
if [ "$frames" = 81 ]; then
  tag=long$variant extra=()
else
  tag=f$frames$variant extra=(--data.init_args.num_frames "$frames" --data.init_args.batch_size 4)
fi
mkdir -p "$out"
solarwm fit --config "$recipe" --root "$out" --trainer.max_steps "$tf_steps" \
  --trainer.default_root_dir "$out/stage2_$tag" "${extra[@]}"
# Stage 3 keeps the attention sink stage 2 trained with (adapter.json's sink_frames).
sink=$(python -c 'import json, sys; print(json.load(open(sys.argv[1])).get("sink_frames") or 0)' \
  "$out/stage2_$tag/adapter/adapter.json")
stage3="$out/stage3${dmd_variant}_after_$tag"
solarwm fit --config "$dmd_recipe" --root "$out" --trainer.max_steps "$dmd_steps" \
  --trainer.default_root_dir "$stage3" --model.init_args.sink_frames "$sink" \
  --model.init_args.init_from.generator "$out/stage2_$tag/adapter" \
  --model.init_args.init_from.score recipes/weights/tiny_base4
student="$stage3/adapter"
tag=$tag$dmd_variant
python benchmarks/long_horizon.py "$student" --worlds 12 --cache "$out/truth" \
  --strip "$out/long_horizon_strip_$tag.png" --json "$out/long_horizon_$tag.json"
python benchmarks/camera_top1.py "$student" --dir "$out/test_multiview" --json "$out/camera_top1_$tag.json"
solarwm test --config recipes/tiny_dmd.yaml --root "$out" --model.init_args.init_from.generator "$student" \
  --model.init_args.sink_frames "$sink" \
  --model.init_args.init_from.score recipes/weights/tiny_base4 --data.init_args.test_multiview_dir null \
  --data.init_args.test_multiview null --trainer.logger false --trainer.enable_progress_bar false
