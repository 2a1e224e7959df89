"""Helpers the multi-process tests share: spawning gloo workers, and driving ``solarwm fit`` on N CPU processes.

Workers run under ``torch.multiprocessing.spawn`` (fresh interpreters that import this module by name: the
parent's ``sys.path``, tests/support included, goes with them). The CLI runs go through a subprocess because
Lightning's launcher re-executes the running script for the other ranks, which must be the CLI and not pytest.
"""

from __future__ import annotations

import csv
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch.distributed as dist
import torch.multiprocessing as mp
import yaml

from commands import solarwm_argv
from routes import RECIPES

SUPPORT = Path(__file__).resolve().parent


def _entry(rank: int, world: int, init_file: str, fn: Callable[..., Any], args: tuple) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        fn(rank, world, *args)
    finally:
        dist.destroy_process_group()


def spawn(fn: Callable[..., Any], world: int, *args: Any) -> None:
    """Run ``fn(rank, world, *args)`` on ``world`` gloo processes; raises if any rank fails."""
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_entry, args=(world, os.path.join(tmp, "init"), fn, args), nprocs=world, join=True)


def fit_overlay(root: Path, corpus: Path, devices: int, batch_size: int, steps: int, strategy: Any = "auto",
                model: dict | None = None, data: dict | None = None, trainer: dict | None = None) -> Path:
    """A recipe overlay: ``steps`` steps, a CSV log of every step, ``batch_size`` per rank, no callbacks."""
    doc = {
        "root": str(root),
        "trainer": {
            "accelerator": "cpu",
            "devices": devices,
            "strategy": strategy,
            "max_steps": steps,
            "val_check_interval": None,
            "limit_val_batches": 0,
            "log_every_n_steps": 1,
            "enable_progress_bar": False,
            "enable_checkpointing": False,
            "enable_model_summary": False,
            "default_root_dir": str(root),
            "callbacks": [],
            "logger": {
                "class_path": "lightning.pytorch.loggers.CSVLogger",
                "init_args": {"save_dir": str(root), "name": "csv"},
            },
            **(trainer or {}),
        },
        "model": {"init_args": dict(model or {})},
        "data": {
            "init_args": {
                "corpus_dir": str(corpus),
                "num_val_clips": 1,
                "batch_size": batch_size,
                "num_workers": 0,
                **(data or {}),
            }
        },
    }
    root.mkdir(parents=True, exist_ok=True)
    path = root / "overlay.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def cli_env() -> dict[str, str]:
    """The environment of a fresh ``solarwm`` launch that can import tests/support (as the spawned ranks do)."""
    # No empty entry: it would put the working directory (the repository root) on sys.path, where the top-level
    # kernels/ folder shadows Hugging Face's kernels package that transformers imports.
    paths = [str(SUPPORT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=os.pathsep.join(paths))
    env.pop("LOCAL_RANK", None)  # a fresh launch, not a child of this process
    return env


def fit(recipe: str | tuple[str, ...], overlay: Path, *extra: str) -> subprocess.CompletedProcess:
    """``solarwm fit --config <recipe>... --config <overlay> [extra]`` in a subprocess (its ranks: its children);
    ``recipe``: one file of recipes/ or several, composed in order before the overlay."""
    recipes = (recipe,) if isinstance(recipe, str) else recipe
    configs = [a for r in recipes for a in ("--config", str(RECIPES / r))]
    result = subprocess.run(
        [*solarwm_argv(), "fit", *configs, "--config", str(overlay), *extra],
        capture_output=True,
        text=True,
        timeout=900,
        env=cli_env(),
    )
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-6000:])
    return result


def logged(root: Path, key: str) -> dict[int, float]:
    """``{step: value}`` of the logged metric ``key`` from the run's CSV log(s) under ``root``."""
    values: dict[int, float] = {}
    for metrics in sorted(root.glob("csv/version_*/metrics.csv")):
        with metrics.open() as f:
            values.update({int(r["step"]): float(r[key]) for r in csv.DictReader(f) if r.get(key)})
    return values
