"""Multi-process tests (gloo on CPU processes): every test here is marked ``multiprocess``.

Shared helpers: ``tests/support/dist_helpers.py`` (spawning gloo workers, ``solarwm fit`` on N processes) and
``tests/support/route_inputs.py`` (tiny routes and a real call on an odd latent frame count).
"""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Refuse a test in this folder that forgot its ``multiprocess`` mark (CI selects them by it)."""
    for item in items:
        if (
            "tests/distributed/" in str(item.fspath).replace("\\", "/")
            and item.get_closest_marker("multiprocess") is None
        ):
            raise pytest.UsageError(f"{item.nodeid}: tests in tests/distributed must be marked multiprocess")
