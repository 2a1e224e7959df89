"""The adapter contract suite (``tests/route_contract.py``) over every registered route (``ROUTES``).

Each route gets the same checks on its tiny preset at its test clip (``conftest.ROUTE_TEST_CLIPS``): geometry,
causal-cache exactness, teacher forcing against the rollout, the export round trip. A route's own file
(``tests/test_route_<route>.py``) adds only what that route alone has.
"""

from __future__ import annotations

import route_contract as contract
from conftest import RECIPES, ROUTE_TEST_CLIPS, published_recipes, tiny_adapter
from solarwm.backbones.export import ROUTES, route_class
from solarwm.train_cli import parse_recipe


def test_every_route_has_a_test_clip_and_a_route_recipe():
    """A registered route has its test clip and ``recipes/routes/<route>.yaml``, which runs under every stage file."""
    assert set(ROUTE_TEST_CLIPS) == set(ROUTES), "add the route's clip to tests/conftest.py ROUTE_TEST_CLIPS"
    for route in ROUTES:
        route_file = RECIPES / "routes" / f"{route}.yaml"
        assert route_file.is_file(), f"add {route_file.relative_to(RECIPES.parent)}"
        for stage_file in sorted((RECIPES / "stages").glob("*.yaml")):
            adapter = parse_recipe(str(stage_file), "--config", str(route_file)).model.init_args.adapter
            assert adapter.class_path.rsplit(".", 1)[-1] == route_class(route).__name__, (stage_file.name, route)


def test_published_entry_points_name_registered_routes():
    """The shipped entry points ``recipes/<prefix>_{bid,tf,dmd}.yaml`` compose a registered route (optional for a new one)."""
    assert set(published_recipes().values()) <= set(ROUTES)
    for prefix in published_recipes():
        assert all((RECIPES / f"{prefix}_{s}.yaml").is_file() for s in ("bid", "tf", "dmd")), prefix


def test_contract_geometry_cache_teacher_forcing_export(route, tmp_path):
    adapter = tiny_adapter(route)
    assert type(adapter) is route_class(route) and adapter.route == route
    clip = ROUTE_TEST_CLIPS[route]
    batch = contract.make_batch(adapter, clip["num_frames"], clip["height"], clip["width"], batch=clip["batch"])
    contract.check_geometry(adapter, batch)
    contract.check_cache_exact(adapter, batch)
    contract.check_teacher_forcing_matches_rollout(adapter, batch)
    contract.check_export_round_trip(adapter, batch, tmp_path / "export")
