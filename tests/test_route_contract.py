"""The adapter contract suite (``tests/route_contract.py``) over every registered route (``ROUTES``).

Each route gets the same checks on its tiny preset at its test clip (``conftest.ROUTE_TEST_CLIPS``): geometry,
causal-cache exactness, teacher forcing against the rollout, the export round trip. A route's own file
(``tests/test_route_<route>.py``) adds only what that route alone has.
"""

from __future__ import annotations

import route_contract as contract
from conftest import ROUTE_TEST_CLIPS, published_recipes, tiny_adapter
from solarwm.backbones.export import ROUTES, route_class


def test_every_route_has_a_test_clip_and_published_recipes():
    assert set(ROUTE_TEST_CLIPS) == set(ROUTES), "add the route's clip to tests/conftest.py ROUTE_TEST_CLIPS"
    assert sorted(published_recipes().values()) == sorted(ROUTES), "every route has recipes/<prefix>_{bid,tf,dmd}.yaml"


def test_contract_geometry_cache_teacher_forcing_export(route, tmp_path):
    adapter = tiny_adapter(route)
    assert type(adapter) is route_class(route) and adapter.route == route
    clip = ROUTE_TEST_CLIPS[route]
    batch = contract.make_batch(adapter, clip["num_frames"], clip["height"], clip["width"], batch=clip["batch"])
    contract.check_geometry(adapter, batch)
    contract.check_cache_exact(adapter, batch)
    contract.check_teacher_forcing_matches_rollout(adapter, batch)
    contract.check_export_round_trip(adapter, batch, tmp_path / "export")
