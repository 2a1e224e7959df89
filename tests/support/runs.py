"""A shipped tiny recipe shrunk to a smoke run: what the CLI, causal-stage and LoRA tests train."""

from __future__ import annotations

from pathlib import Path

import yaml

from solarwm.lightning_cli import parse_recipe

from routes import RECIPES


def tiny_recipe(root: Path, recipe: str = "tiny_bid.yaml", corpus: Path | None = None, **adapter_init) -> Path:
    """A shipped tiny recipe as fit resolves it with ``--root root`` (every output under ``root``), shrunk to 2 steps
    on 3 rendered 9-frame clips (rendered by the datamodule itself); the shipped file is read, never rewritten."""
    cfg = parse_recipe(str(RECIPES / recipe), "--root", str(root), "--trainer.default_root_dir", str(root))
    doc = cfg.as_dict()
    doc.pop("config", None)
    doc["trainer"].update(max_steps=2, val_check_interval=2, log_every_n_steps=1)
    for cb in doc["trainer"]["callbacks"]:
        args = cb["init_args"]
        if cb["class_path"].endswith("EvalVideoLogger"):
            args.update(every_n_steps=2, num_steps=2)
        elif cb["class_path"].endswith(("ModelCheckpoint", "StepCheckpoint")):
            args.update(dirpath=str(root / "checkpoints"), every_n_train_steps=2)
    doc["model"]["init_args"]["adapter"]["init_args"].update(adapter_init)
    corpus = corpus or root / "corpus"
    doc["data"]["init_args"].update(corpus_dir=str(corpus), num_frames=5, width=32, height=32, num_val_clips=1)
    # One view per world: with 3 clips, a 4-view world would be held out whole and leave nothing to train on.
    doc["data"]["init_args"]["synth"].update(clips=3, frames=9, width=48, height=32, views=1)
    # `solarwm test` on the held-out clip (tests/datamodules/test_datamodules_windows.py covers a separate test corpus).
    doc["data"]["init_args"].update(test_corpus_dir=None, test_synth=None, test_multiview_dir=None, test_multiview=None)
    root.mkdir(parents=True, exist_ok=True)
    path = root / "recipe.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path
