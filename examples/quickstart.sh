#!/usr/bin/env bash
# The embedded default, end to end on a CPU: render worlds → inspect them.
# (Grows with the project: → fit the tiny recipe → predict a rollout.)
set -euo pipefail
OUT=${SOLARWM_OUT:-outputs/quickstart}
solarwm data synth --out "$OUT/worlds" --clips 32 --frames 33 --size 64x64 --fps 16 --seed 0
solarwm data inspect "$OUT/worlds" > "$OUT/inspect.json"
python - "$OUT" <<'PY'
import json, sys
s = json.load(open(f"{sys.argv[1]}/inspect.json"))
print(f"rendered {s['clips']} clips ({s['frames']} frames), {s['valid']} valid -> {sys.argv[1]}/worlds")
PY
