"""The adapter contract suite (``tests/support/route_contract.py``) over every registered route (``ROUTES``).

Each route gets the same clauses on its tiny preset at its test clip (``routes.ROUTE_TEST_CLIPS``), one test per
clause x route so a failure names both: the registered class, geometry, causal-cache exactness, teacher forcing
against the rollout, the export round trip, LoRA (``routes.ROUTE_TEST_LORA``). A route's own file
(``tests/backbones/test_route_<route>.py``) adds only what that route alone has.
"""

from __future__ import annotations

import pytest

from solarwm.backbones.export import ROUTES, route_class
from solarwm.train_cli import parse_recipe

import route_contract as contract
from routes import RECIPES, ROUTE_TEST_CLIPS, ROUTE_TEST_LORA, published_recipes, tiny_adapter


@pytest.mark.slow
def test_every_route_has_a_test_clip_and_a_route_recipe():
    """A registered route has its test clip and ``recipes/routes/<route>.yaml``, which runs under every stage file."""
    assert set(ROUTE_TEST_CLIPS) == set(ROUTES), "add the route's clip to tests/support/routes.py ROUTE_TEST_CLIPS"
    for route in ROUTES:
        route_file = RECIPES / "routes" / f"{route}.yaml"
        assert route_file.is_file(), f"add {route_file.relative_to(RECIPES.parent)}"
        for stage_file in sorted((RECIPES / "stages").glob("*.yaml")):
            adapter = parse_recipe(str(stage_file), "--config", str(route_file)).model.init_args.adapter
            assert adapter.class_path.rsplit(".", 1)[-1] == route_class(route).__name__, (stage_file.name, route)


def test_published_entry_points_name_registered_routes():
    """The shipped entry points ``recipes/<prefix>_{bid,tf,dmd}.yaml`` compose a registered route.

    Optional for a new one.
    """
    assert set(published_recipes().values()) <= set(ROUTES)
    for prefix in published_recipes():
        assert all((RECIPES / f"{prefix}_{s}.yaml").is_file() for s in ("bid", "tf", "dmd")), prefix


def _built(route: str) -> tuple:
    adapter = tiny_adapter(route)
    clip = ROUTE_TEST_CLIPS[route]
    return adapter, contract.make_batch(adapter, clip["num_frames"], clip["height"], clip["width"], batch=clip["batch"])


def test_contract_builds_the_registered_class(route):
    adapter = tiny_adapter(route)
    assert type(adapter) is route_class(route) and adapter.route == route


def test_contract_geometry(route):
    contract.check_geometry(*_built(route))


@pytest.mark.slow
def test_contract_cache_exact(route):
    contract.check_cache_exact(*_built(route))


@pytest.mark.slow
def test_contract_teacher_forcing_matches_rollout(route):
    contract.check_teacher_forcing_matches_rollout(*_built(route))


@pytest.mark.slow
def test_contract_export_round_trip(route, tmp_path):
    contract.check_export_round_trip(*_built(route), tmp_path / "export")


@pytest.mark.slow
def test_contract_lora(route, tmp_path):
    adapter = tiny_adapter(route)
    clip = ROUTE_TEST_CLIPS[route]
    batch = contract.make_batch(adapter, clip["num_frames"], clip["height"], clip["width"], batch=clip["batch"])
    contract.check_lora(adapter, batch, tmp_path, ROUTE_TEST_LORA[route])
