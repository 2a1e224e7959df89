"""The official pipeline's plug-ins are listed with why they cannot run, and refuse before reading any weights."""

from __future__ import annotations

import pytest

from solarwm.cli import main
from solarwm.data.estimators import ESTIMATORS, EstimatorUnavailable, estimator_status, get_estimator


@pytest.mark.parametrize(
    "name,module", [("pi3x", "pi3"), ("moge2", "moge"), ("geocalib", "geocalib"), ("vipe", "vipe")]
)
def test_official_plugins_refuse_up_front_and_name_the_package(name, module, tmp_path):
    assert name in ESTIMATORS
    (tmp_path / "model.safetensors").write_bytes(b"not weights")  # never opened
    with pytest.raises(EstimatorUnavailable) as err:
        get_estimator(name, weights=str(tmp_path))
    assert err.value.name == name and f"package not importable: {module}" in err.value.reason
    assert str(err.value).startswith(f"estimator_unavailable: {name}: ")


def test_unknown_estimator():
    """The error lists every registered plug-in (tests may register more, e.g. the ingest fixtures' oracle)."""
    with pytest.raises(EstimatorUnavailable, match="unknown estimator; known: ") as err:
        get_estimator("colmap-gpu")
    known = str(err.value).split("known: ", 1)[1].split(", ")
    assert {"colmap", "geocalib", "moge2", "pi3x", "vipe"} <= set(known) and known == sorted(known)


def test_list_shows_which_estimators_run(capsys):
    rows = {r["name"]: r for r in estimator_status()}
    assert rows["colmap"]["available"] and not rows["vipe"]["available"] and "GPU" in rows["vipe"]["why"]
    assert main(["data", "ingest", "--list"]) == 0
    out = capsys.readouterr().out
    assert "estimator colmap     available (default)" in out
    assert "estimator pi3x       unavailable: package not importable: pi3" in out
