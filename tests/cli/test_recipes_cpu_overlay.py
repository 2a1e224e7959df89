"""Every published recipe (route x stage) runs on the CPU through the overlay `recipes/tiny.yaml`:

    solarwm fit --config recipes/<route>_<stage>.yaml --config recipes/tiny.yaml --trainer.max_steps 2
"""

from __future__ import annotations

from pathlib import Path

import pytest

from solarwm.backbones.base import read_adapter_json
from solarwm.train_cli import main

from routes import RECIPES, published_recipes

ROUTES = tuple(published_recipes())  # recipe prefixes of the registered routes (wan22_5b, ..., minimax_h3)
STAGES = {"bid": "bidirectional", "tf": "tf_anyflow", "dmd": "dmd"}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("overlay")


@pytest.mark.slow
@pytest.mark.parametrize("stage", sorted(STAGES))
@pytest.mark.parametrize("route", ROUTES)
def test_published_recipe_runs_on_cpu_with_the_overlay(route: str, stage: str, workdir: Path) -> None:
    """`--root` moves every output of the run; the routes share one rendered corpus."""
    root = workdir / route
    assert main(["fit", "--config", str(RECIPES / f"{route}_{stage}.yaml"), "--config", str(RECIPES / "tiny.yaml"),
                 "--root", str(root), "--data.init_args.corpus_dir", str(workdir / "corpus"),
                 "--trainer.max_steps", "2"]) == 0
    number = {"bid": 1, "tf": 2, "dmd": 3}[stage]
    meta = read_adapter_json(root / f"stage{number}" / "adapter")
    assert meta["stage"] == STAGES[stage] and meta["config"] is not None


@pytest.mark.slow
@pytest.mark.parametrize("route", ROUTES)
def test_published_recipe_without_weights_names_the_path_and_the_overlay(route: str, capsys) -> None:
    """Without weights a published recipe stops before building its model: one line naming the path and the overlay."""
    from solarwm.cli import main as solarwm

    assert solarwm(["fit", "--config", str(RECIPES / f"{route}_bid.yaml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "pretrained_path" in err and "--config recipes/tiny.yaml" in err and "Traceback" not in err
