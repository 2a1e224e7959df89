"""Weight-backed estimator plug-ins fail with a specific ``estimator_unavailable`` reason when absent here."""

from __future__ import annotations

import pytest

from solarwm.data.estimators import ESTIMATORS, EstimatorUnavailable, get_estimator


@pytest.mark.parametrize("name,module", [("pi3x", "pi3"), ("moge2", "moge"), ("geocalib", "geocalib"), ("vipe", "vipe")])
def test_missing_package_names_it(name, module, tmp_path):
    assert name in ESTIMATORS
    with pytest.raises(EstimatorUnavailable) as err:
        get_estimator(name, weights=str(tmp_path))
    assert err.value.name == name and f"package not importable: {module}" in err.value.reason
    assert str(err.value).startswith(f"estimator_unavailable: {name}: ")


def test_unknown_estimator():
    """The error lists every registered plug-in (tests may register more, e.g. the ingest fixtures' oracle)."""
    with pytest.raises(EstimatorUnavailable, match="unknown estimator; known: ") as err:
        get_estimator("colmap-gpu")
    known = str(err.value).split("known: ", 1)[1].split(", ")
    assert {"cpu-sfm", "geocalib", "moge2", "pi3x", "vipe"} <= set(known) and known == sorted(known)


def test_missing_weights_are_named(tmp_path, monkeypatch):
    import sys
    import types

    from solarwm.data.estimators import _local

    monkeypatch.setitem(sys.modules, "fake_model_pkg", types.ModuleType("fake_model_pkg"))
    assert _local.require_module("x", "fake_model_pkg", "x") is sys.modules["fake_model_pkg"]
    with pytest.raises(EstimatorUnavailable, match="no weights path given"):
        _local.require_weights("pi3x", None, ("model.safetensors",))
    with pytest.raises(EstimatorUnavailable, match=r"has none of \['model.safetensors'\]"):
        _local.require_weights("pi3x", str(tmp_path), ("model.safetensors",))
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert _local.require_weights("pi3x", str(tmp_path), ("model.safetensors",)) == tmp_path / "model.safetensors"
