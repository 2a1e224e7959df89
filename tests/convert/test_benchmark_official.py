"""`benchmarks/device.py --dry-run --official`: the official-layout benchmark's code runs at a tiny size on the CPU."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "device.py"


@pytest.mark.slow  # a subprocess that imports the model stack and converts: ~35 s on 2 cores
def test_official_section_converts_and_rolls_out_at_tiny_size() -> None:
    result = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--official", "--skip", "attention",
                             "train_step", "rollout"], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])["official"]
    for key in ("convert_s", "generated_fps", "peak_memory_mib", "seconds", "parameters"):
        assert isinstance(report[key], (int, float)) and math.isfinite(report[key]) and report[key] > 0, key
    assert report["frames"] == 9  # 3 latent frames of one block: 4 * 2 + 1 pixel frames
    assert (report["timestep_rounding"], report["latent_camera"]) == ("bfloat16", "group_first")
