"""`data report`: figures and an HTML page from a corpus and from a release."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from solarwm.data.release import pack_command
from solarwm.data.report import report_command

from corpora import make_corpus

POLICY = Path(__file__).resolve().parents[2] / "recipes" / "policies" / "solarwm-v1.yaml"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return make_corpus(tmp_path_factory.mktemp("report"))


def _check_page(out: Path) -> dict:
    summary = json.loads((out / "report.json").read_text())
    page = (out / "index.html").read_text()
    referenced = set(re.findall(r'<img src="([^"]+)"', page))
    assert referenced == set(summary["figures"])
    for name in referenced:
        assert (out / name).read_bytes()[:8] == PNG_MAGIC
    assert {"owners_by_tier.png", "length_by_tier.png", "rejection_reasons.png", "metrics_synthetic.png"} <= referenced
    return summary


@pytest.mark.slow
def test_report_from_corpus(corpus: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "report"
    assert report_command(str(out), corpus=str(corpus), policy=str(POLICY)) == 0
    summary = _check_page(out)
    assert summary["clips"] == 9
    assert summary["by_owner"]["abot"] == {"kept-high": 1, "rejected": 1, "failed": 1, "pending": 1}
    assert summary["by_length"]["<81"]["kept-xhigh"] == 2
    assert summary["reasons"]["synthetic"] == {"metrics.vmaf >= 0.5": 1}
    assert "metrics.vmaf" in summary["metric_columns"]["synthetic"]
    page = (out / "index.html").read_text()
    assert "ingested 9 = kept-xhigh 2 + kept-high 3 + rejected 2 + failed 1" in page
    assert "Thresholds from policy solarwm-v1" in page


@pytest.mark.slow
def test_report_from_release_matches_corpus(corpus: Path, tmp_path: Path, capsys) -> None:
    release = tmp_path / "release"
    pack_command(str(corpus), str(release))
    report_command(str(tmp_path / "a"), corpus=str(corpus), policy=str(POLICY))
    report_command(str(tmp_path / "b"), release=str(release), policy=str(tmp_path / "absent.yaml"))
    a = json.loads((tmp_path / "a/report.json").read_text())
    b = _check_page(tmp_path / "b")
    assert a["by_owner"] == b["by_owner"] and a["by_length"] == b["by_length"] and a["reasons"] == b["reasons"]
    assert a["accounting"] == b["accounting"]
    assert b["policy"] is None and "without thresholds" in (tmp_path / "b/index.html").read_text()


def test_report_needs_exactly_one_source(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="exactly one of --corpus or --release"):
        report_command(str(tmp_path / "x"))
