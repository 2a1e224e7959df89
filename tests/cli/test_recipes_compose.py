"""Every shipped recipe parses, composes from one route file and one stage file, moves whole with ``--root``, and
resolves to the frozen config in tests/fixtures/resolved_recipes.json (the refactor that introduced composition
changed no number).

After an intended change of a recipe value, refreeze and review the diff of the JSON:
    python tests/cli/test_recipes_compose.py --freeze
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from solarwm.train_cli import RecipeError, expand_configs, parse_recipe

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "recipes"
FROZEN = Path(__file__).parents[1] / "fixtures" / "resolved_recipes.json"
#: The entry points' short names (file names only; recipes/README.md) -> the code's route and stage names.
ROUTE_ALIASES = {
    "wan22_5b": "wan22_ti2v_5b",
    "wan22_14b": "wan22_i2v_14b",
    "ltx25": "ltx25",
    "minimax_h3": "minimax_h3",
    "tiny": "wan22_ti2v_5b",
}
STAGE_ALIASES = {"bid": "bidirectional", "tf": "tf_anyflow", "dmd": "dmd"}
#: Files that are parts of a recipe, not runs: the CPU overlay and the embedded default's shared part.
PARTS = {"tiny.yaml", "tiny_chain.yaml"}
RUNNABLE = sorted(p.name for p in RECIPES.glob("*.yaml") if p.name not in PARTS)
ENTRIES = [(r, s) for r in ROUTE_ALIASES for s in STAGE_ALIASES]


def resolved(name: str, *args: str) -> dict:
    """The recipe as ``solarwm fit --config recipes/<name>`` resolves it, as JSON-able dicts.

    Paths as run from the repo.
    """
    cfg = parse_recipe(str(Path("recipes") / name), *args).as_dict()
    cfg.pop("config", None)
    return json.loads(json.dumps(cfg, default=str))


def _strings(value, path=""):
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(v, f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _strings(v, f"{path}[{i}]")
    elif isinstance(value, str):
        yield path, value


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch) -> None:
    monkeypatch.chdir(ROOT)  # the recipes' relative paths (runs/, recipes/weights/) are the repository's


@pytest.mark.slow
@pytest.mark.parametrize("name", RUNNABLE)
def test_recipe_resolves_to_the_frozen_config(name: str) -> None:
    """Each shipped recipe parses as is and resolves to exactly the frozen config (every number, every path)."""
    frozen = json.loads(FROZEN.read_text())
    assert name in frozen, f"{name} is not frozen: python tests/cli/test_recipes_compose.py --freeze"
    assert resolved(name) == frozen[name]


def test_frozen_configs_are_all_shipped() -> None:
    assert sorted(json.loads(FROZEN.read_text())) == RUNNABLE


@pytest.mark.slow
@pytest.mark.parametrize("alias,stage", ENTRIES)
def test_entry_point_is_its_stage_under_its_route(alias: str, stage: str) -> None:
    """``<route>_<stage>.yaml`` composes recipes/stages/<stage>.yaml then recipes/routes/<route>.yaml (code names)."""
    name = f"{alias}_{stage}.yaml"
    parts = [Path(p).relative_to(RECIPES).as_posix() for p in expand_configs(["--config", str(RECIPES / name)])[1::2]]
    assert parts[:2] == [f"stages/{STAGE_ALIASES[stage]}.yaml", f"routes/{ROUTE_ALIASES[alias]}.yaml"]
    assert parts[-1] == name
    cfg = parse_recipe(str(RECIPES / name))
    from importlib import import_module

    def cls(spec):
        module, _, attr = spec.class_path.rpartition(".")
        return getattr(import_module(module), attr)

    assert cls(cfg.model).stage_name == STAGE_ALIASES[stage]
    assert cls(cfg.model.init_args.adapter).route == ROUTE_ALIASES[alias]


@pytest.mark.slow
@pytest.mark.parametrize("stage", sorted(set(STAGE_ALIASES.values())))
@pytest.mark.parametrize("route", sorted(set(ROUTE_ALIASES.values())))
def test_route_and_stage_files_compose_on_the_command_line(route: str, stage: str) -> None:
    """A run is ``--config stages/<stage>.yaml --config routes/<route>.yaml``, outputs under ``runs/<route>``."""
    cfg = parse_recipe(str(RECIPES / "stages" / f"{stage}.yaml"), "--config", str(RECIPES / "routes" / f"{route}.yaml"))
    assert cfg.root == f"runs/{route}"
    assert cfg.trainer.default_root_dir.startswith(f"runs/{route}/stage")


@pytest.mark.slow
@pytest.mark.parametrize("name", RUNNABLE)
def test_root_moves_every_output(name: str, tmp_path: Path) -> None:
    """With ``--root DIR`` no path of the run is left under runs/: corpus, logs, checkpoints, exports, inits."""
    cfg = resolved(name, "--root", str(tmp_path))
    left = [(k, v) for k, v in _strings(cfg) if "runs/" in v and "command" not in k]
    assert not left


@pytest.mark.slow
def test_three_stages_layout_under_one_root(tmp_path: Path) -> None:
    """The tiny chain under ``--root OUT``: OUT/{corpus,test_mixed}, OUT/stageN/{adapter,last.ckpt}, inits chained."""
    bid, tf, dmd = (
        parse_recipe(str(RECIPES / f"tiny_{s}.yaml"), "--root", str(tmp_path)) for s in ("bid", "tf", "dmd")
    )
    for n, cfg in enumerate((bid, tf, dmd), start=1):
        assert cfg.data.init_args.corpus_dir == f"{tmp_path}/corpus"
        assert cfg.data.init_args.test_corpus_dir == f"{tmp_path}/test_mixed"
        dirs = {
            cb.class_path.rsplit(".", 1)[1]: cb.init_args.dirpath
            for cb in cfg.trainer.callbacks
            if "dirpath" in cb.init_args
        }
        assert dirs["AdapterExport"] == f"{tmp_path}/stage{n}/adapter"
        assert dirs.get("ModelCheckpoint", dirs.get("StepCheckpoint")) == f"{tmp_path}/stage{n}"
    assert tf.model.init_args.init_from == f"{tmp_path}/stage1/adapter"
    assert (dmd.model.init_args.init_from.generator, dmd.model.init_args.init_from.score) == (
        f"{tmp_path}/stage2/adapter",
        f"{tmp_path}/stage1/adapter",
    )


@pytest.mark.parametrize(
    "name",
    RUNNABLE
    + ["tiny.yaml", "tiny_chain.yaml"]
    + [f"routes/{p.name}" for p in sorted((RECIPES / "routes").glob("*.yaml"))]
    + [f"stages/{p.name}" for p in sorted((RECIPES / "stages").glob("*.yaml"))],
)
def test_header_says_what_and_how_only(name: str) -> None:
    """A recipe's header is a short purpose and its command; tuning history lives in docs/results/."""
    lines = (RECIPES / name).read_text().splitlines()
    header = [line for line in lines[: next(i for i, line in enumerate(lines) if not line.startswith("#"))]]
    assert 1 <= len(header) <= 16, (name, len(header))
    assert all(len(line) <= 120 for line in header), name
    if name not in PARTS:
        assert any("solarwm fit" in line or "solarwm test" in line for line in header), name


def _write(path: Path, doc: dict) -> str:
    path.write_text(yaml.safe_dump(doc, allow_unicode=True))
    return str(path)


def test_compose_errors_name_the_file(tmp_path: Path) -> None:
    missing = _write(tmp_path / "a.yaml", {"compose": ["nope.yaml"]})
    with pytest.raises(RecipeError, match=r"a.yaml: compose names .*nope.yaml, which does not exist"):
        expand_configs(["--config", missing])
    loop = _write(tmp_path / "b.yaml", {"compose": ["b.yaml"]})
    with pytest.raises(RecipeError, match="composes itself"):
        expand_configs(["--config", loop])
    bad = _write(tmp_path / "c.yaml", {"compose": {"x": 1}})
    with pytest.raises(RecipeError, match="must be a list"):
        expand_configs(["--config", bad])


def test_unset_interpolation_is_a_named_error(tmp_path: Path) -> None:
    overlay = _write(tmp_path / "o.yaml", {"trainer": {"default_root_dir": "${nowhere}/x"}})
    with pytest.raises(RecipeError, match=r"\$\{nowhere\} names no set config key"):
        parse_recipe(str(RECIPES / "tiny_bid.yaml"), "--config", overlay)


def test_user_overlay_composes_a_shipped_recipe(tmp_path: Path) -> None:
    """A user's own recipe lays itself over a shipped one instead of copying it; its values win."""
    mine = _write(
        tmp_path / "mine.yaml",
        {"compose": [str(RECIPES / "tiny_bid.yaml")], "root": str(tmp_path / "r"), "trainer": {"max_steps": 7}},
    )
    cfg = parse_recipe(mine)
    assert cfg.trainer.max_steps == 7 and cfg.trainer.default_root_dir == f"{tmp_path}/r/stage1"
    assert cfg.compose is None  # read before parsing; a saved config.yaml must not compose again


if __name__ == "__main__" and "--freeze" in sys.argv:
    import os

    os.chdir(ROOT)
    FROZEN.parent.mkdir(parents=True, exist_ok=True)
    FROZEN.write_text(
        json.dumps({name: resolved(name) for name in RUNNABLE}, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
    )
    print(f"wrote {FROZEN} ({len(RUNNABLE)} recipes)")
