"""Recipe YAML checking: bad keys/types fail before anything is built; the published recipe on meta."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import pytest
import torch
import yaml

from solarwm.backbones.wan22_ti2v_5b import Wan22TI2V5BAdapter, Wan22TI2V5BConfig
from solarwm.stages.bidirectional import BidirectionalModule
from solarwm.train_cli import parse_recipe

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


@pytest.fixture
def built(monkeypatch) -> list[str]:
    """Records every construction of the stage or the adapter (signatures kept for jsonargparse)."""
    calls: list[str] = []
    for cls in (BidirectionalModule, Wan22TI2V5BAdapter):
        original = cls.__init__

        @functools.wraps(original)
        def spy(self, *args, _original=original, _name=cls.__name__, **kwargs):
            calls.append(_name)
            _original(self, *args, **kwargs)

        monkeypatch.setattr(cls, "__init__", spy)
    return calls


def _recipe(tmp_path: Path, edit) -> str:
    """tiny_bid.yaml as fit resolves it with every output under ``tmp_path``, then ``edit``-ed."""
    doc = parse_recipe(str(RECIPES / "tiny_bid.yaml"), "--root", str(tmp_path)).as_dict()
    doc.pop("config", None)
    edit(doc)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


@pytest.mark.slow
@pytest.mark.parametrize(
    "edit,key",
    [
        (lambda d: d["data"]["init_args"].update(num_framez=5), "num_framez"),
        (lambda d: d["model"]["init_args"]["adapter"]["init_args"].update(presett="tiny"), "presett"),
        (lambda d: d["trainer"].update(max_steps="many"), "max_steps"),
        (lambda d: d["data"]["init_args"].update(width="wide"), "width"),
    ],
    ids=["unknown-data-key", "unknown-adapter-key", "wrong-type-trainer", "wrong-type-data"],
)
def test_bad_recipe_fails_before_building(tmp_path, capsys, built, edit, key) -> None:
    """jsonargparse rejects the YAML, naming the key, before any model or corpus exists."""
    from solarwm.cli import main as cli_main

    config = _recipe(tmp_path, edit)
    assert cli_main(["fit", "--config", config]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("solarwm fit: error: ") and key in err, err
    assert built == []
    assert not (tmp_path / "corpus").exists()


# tiny.yaml (the CPU overlay) and tiny_chain.yaml (the embedded default's shared part) are parts, not runs.
@pytest.mark.slow
@pytest.mark.parametrize(
    "recipe", sorted(p.name for p in RECIPES.glob("*.yaml") if p.name not in ("tiny.yaml", "tiny_chain.yaml"))
)
def test_every_recipe_parses_as_is(recipe: str) -> None:
    """Each stage recipe passes the CLI's checks with no other argument; causal stages follow the reference."""
    cfg = parse_recipe(str(RECIPES / recipe))
    model = cfg.model.init_args
    if recipe.endswith("_tf.yaml"):
        assert model.init_from is not None and model.flow_map_gate == 0.25
    if recipe.endswith("_dmd.yaml"):
        assert model.student_update_every == 5 and model.init_from.generator and model.init_from.score
        assert cfg.trainer.gradient_clip_val is None  # DMD clips inside its manual optimisation


def test_tiny_recipe_parses_as_is() -> None:
    """The embedded default parses with no other argument."""
    cfg = parse_recipe(str(RECIPES / "tiny_bid.yaml"))
    assert cfg.model.init_args.adapter.init_args.preset == "tiny"
    assert cfg.data.init_args.num_frames == 17


def test_published_recipe_instantiates_on_meta() -> None:
    """wan22_5b_bid.yaml parses with the CLI parser; its adapter builds at full size on the meta device."""
    cfg = parse_recipe(str(RECIPES / "wan22_5b_bid.yaml"))
    adapter_cfg = cfg.model.init_args.adapter
    assert adapter_cfg.class_path == "solarwm.backbones.wan22_ti2v_5b.Wan22TI2V5BAdapter"
    init = adapter_cfg.init_args
    assert init.preset == "published" and init.pretrained_path is None
    assert cfg.trainer.precision == "bf16-mixed"
    assert cfg.data.init_args.train_index is None and cfg.data.init_args.num_frames == 81
    config = Wan22TI2V5BConfig.published()
    # UMT5 needs its weights folder even to be shaped; the meta check covers transformer + codec.
    config = dataclasses.replace(config, text_encoder="none")
    adapter = Wan22TI2V5BAdapter(config=config, pretrained_path=init.pretrained_path, device="meta")
    params = list(adapter.transformer.parameters())
    assert all(p.device == torch.device("meta") for p in params)
    assert 4.0e9 < sum(p.numel() for p in params) < 6.0e9  # the 5B transformer
    assert adapter.valid_num_frames(cfg.data.init_args.num_frames)
