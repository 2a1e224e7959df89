"""`benchmarks/device.py --dry-run`: the GPU benchmark's code runs at tiny shapes on the CPU and prints its figures."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "device.py"


@pytest.mark.slow
def test_device_benchmark_dry_run_prints_finite_positive_figures() -> None:
    result = subprocess.run([sys.executable, str(SCRIPT), "--dry-run"], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["dry_run"] is True and report["device"] == "cpu"
    expected = {
        "attention": ["fwd_sdpa_ms", "fwd_prope_ms", "fwd_ratio_prope_over_sdpa", "fwd_bwd_sdpa_ms", "fwd_bwd_prope_ms",
                      "fwd_bwd_ratio_prope_over_sdpa"],
        "train_step": ["s_per_step", "peak_memory_mib", "loss", "params"],
        "rollout": ["generated_fps", "frames", "memory_mib_block2", "memory_mib_block4", "peak_mib_block2",
                    "peak_mib_block4", "memory_ratio_late_over_early", "peak_ratio_late_over_early"],
    }
    for section, keys in expected.items():
        for key in keys:
            value = report[section][key]
            assert isinstance(value, (int, float)) and math.isfinite(value) and value > 0, (section, key, value)
    # 4 blocks of 3 latent frames = 12 latents = 4 * 11 + 1 pixel frames (Wan: 4n + 1)
    assert report["rollout"]["blocks"] == 4 and report["rollout"]["frames"] == 4 * 11 + 1
