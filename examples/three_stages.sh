#!/usr/bin/env bash
# The paper's three-stage recipe end to end on the embedded default (CPU, no weights, no datasets):
#   render worlds -> stage 1 (bidirectional) -> stage 2 (TF-AnyFlow) -> stage 3 (DMD) -> `solarwm test` each.
# Writes OUT/{corpus,test_mixed,test_multiview}, OUT/stage{1,2,3}/{adapter/,last.ckpt}, OUT/metrics.json,
# OUT/long_horizon.json and prints the metrics tables: unseen worlds with the default 6-DoF motion and with slow pans
# (examples/stage_metrics.py, with camera top-1 on multi-view worlds), then one minute of unseen worlds
# (benchmarks/long_horizon.py).
#   bash examples/three_stages.sh [OUT]        (default OUT: outputs/three_stages)
set -euo pipefail
OUT=${1:-outputs/three_stages}
mkdir -p "$OUT"

# The tiny recipes write everything under their root (runs/tiny); `--root OUT` moves it all under OUT, and each
# stage reads the previous stage's export from there.
python - "$OUT" > "$OUT/synth_args.new" <<'PY'
import sys
from solarwm.train_cli import parse_recipe
s = parse_recipe("recipes/tiny_bid.yaml", "--root", sys.argv[1]).data.init_args.synth
print(f"--clips {s.clips} --frames {s.frames} --size {s.width}x{s.height} --fps {s.fps} --seed {s.seed} --motion {s.motion} --views {s.views}")
PY
# A rerun resumes OUT only if its worlds are the same (synth adds clips to a folder; it never removes any).
if [ -f "$OUT/synth_args.txt" ] && ! cmp -s "$OUT/synth_args.txt" "$OUT/synth_args.new"; then
  echo "three_stages: $OUT was rendered with '$(cat "$OUT/synth_args.txt")', the recipe now asks for '$(cat "$OUT/synth_args.new")'; use another OUT or delete it" >&2
  exit 2
fi
mv "$OUT/synth_args.new" "$OUT/synth_args.txt"
# shellcheck disable=SC2046
solarwm data synth --out "$OUT/corpus" $(cat "$OUT/synth_args.txt") > "$OUT/synth.json"

# A stage whose export exists is done (a rerun resumes after the last finished stage).
n=1
for stage in bid tf dmd; do
  if [ -f "$OUT/stage$n/adapter/adapter.json" ]; then
    echo "stage $n ($stage): $OUT/stage$n/adapter exists, skipped"
  else
    solarwm fit --config "recipes/tiny_$stage.yaml" --root "$OUT"
  fi
  n=$((n + 1))
done

python examples/stage_metrics.py "$OUT"
# Beside the short clips: stage 3 over one minute of unseen worlds (per 5-s window: detail ratio, PSNR over the
# first frame repeated); the truths are rendered once into OUT/long_truth.
python benchmarks/long_horizon.py "$OUT/stage3/adapter" --worlds 12 --cache "$OUT/long_truth" --json "$OUT/long_horizon.json"
