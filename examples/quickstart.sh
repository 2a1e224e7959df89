#!/usr/bin/env bash
# The embedded default, end to end on a CPU (no weights, no datasets, a few minutes):
#   render procedural worlds → check them → fit the tiny bidirectional recipe → predict an mp4
#   from a held-out first frame along a new camera trajectory.
set -euo pipefail
ROOT=runs/tiny             # where the tiny recipes write (root: corpus/, test_mixed/, stage1/ ...)
RUN=$ROOT/stage1           # stage 1's logs, checkpoints and export
rm -rf "$ROOT"             # a fresh start: no corpus, checkpoint or logs of an earlier run (or recipe) are reused
OUT=${SOLARWM_OUT:-outputs/quickstart}
mkdir -p "$OUT"

# 1. Render worlds (the recipe would render them itself on first use; done here to show the verb).
solarwm data synth --out "$ROOT/corpus" --clips 128 --frames 33 --size 96x64 --fps 8 --seed 0 --views 4 > "$OUT/synth.json"
solarwm data inspect "$ROOT/corpus" > "$OUT/inspect.json"

# 2. Train stage 1 (bidirectional adaptation) of the tiny Wan2.2 route.
solarwm fit --config recipes/tiny_bid.yaml

# 3. Roll out: a trajectory file (a 2 m forward walk, then a turn to the left) and a generated clip.
python - "$OUT/trajectory.json" <<'PY'
import sys
from solarwm.camera.trajectory import compose_segments, forward, save_trajectory, yaw_turn
save_trajectory(compose_segments([forward(8, 2.0), yaw_turn(8, -20.0)], fps=8.0, width=64, height=64), sys.argv[1])
PY
# A held-out clip (the datamodule's validation split, by stable id), never one the model trained on.
FIRST=$(python - <<'PY'
from solarwm.datamodules import WorldDataModule
dm = WorldDataModule(corpus_dir="runs/tiny/corpus", num_val_clips=8, num_frames=17)
dm.setup("fit")
print(dm.val_dataset.rows[0].folder)
PY
)
solarwm predict --config recipes/tiny_bid.yaml --checkpoint "$RUN/last.ckpt" \
  --first_frame "$FIRST" --caption "$(cat "$FIRST/prompt.txt")" \
  --trajectory "$OUT/trajectory.json" --output "$OUT/rollout.mp4" > "$OUT/predict.json"

echo "rendered corpus:   $ROOT/corpus ($(python -c "import json;s=json.load(open('$OUT/inspect.json'));print(s['valid'],'valid clips')"))"
echo "generated video:   $OUT/rollout.mp4"
echo "eval videos (mp4): $(ls -d "$RUN"/tb/version_*/eval_videos | tail -n 1)"
echo "TensorBoard logs:  tensorboard --logdir $RUN/tb"
echo "exported adapter:  $RUN/adapter (diffusers transformer + camera.safetensors)"
