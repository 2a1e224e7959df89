"""``solarwm convert official`` refuses a bad package in one line, exit 2, writing nothing."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Callable

import pytest
import torch

import solarwm.convert as convert
from solarwm.cli import main

from official_packages import TINY_ARCH, write_package


class CodePayload:
    """Unpickling this would run ``touch <marker>``: a package must never get that far."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _reseal(package: Path) -> None:
    """Rewrite the manifest's size of model.pt and COMPLETE's digest, so only model.pt itself is wrong."""
    manifest = json.loads((package / "checkpoint-manifest.json").read_text())
    manifest["files"] = [{"path": "model.pt", "size": (package / "model.pt").stat().st_size}]
    raw = json.dumps(manifest).encode()
    (package / "checkpoint-manifest.json").write_bytes(raw)
    complete = json.loads((package / "COMPLETE.json").read_text())
    complete["manifest_digest"] = hashlib.blake2s(raw).hexdigest()
    (package / "COMPLETE.json").write_text(json.dumps(complete))


def _rewrite(package: Path, edit: Callable[[dict], None]) -> None:
    """Edit ``model.pt``'s generator_ema state, then reseal the transaction."""
    checkpoint = torch.load(package / "model.pt", weights_only=True)
    edit(checkpoint["generator_ema"])
    torch.save(checkpoint, package / "model.pt")
    _reseal(package)


def _no_complete(p: Path) -> None:
    (p / "COMPLETE.json").unlink()


def _truncated(p: Path) -> None:
    data = (p / "model.pt").read_bytes()
    (p / "model.pt").write_bytes(data[: len(data) // 2])
    _reseal(p)  # the transaction agrees: torch.load itself must refuse the file


def _size_mismatch(p: Path) -> None:
    with (p / "model.pt").open("ab") as f:
        f.write(b"\0" * 16)


def _hash_mismatch(p: Path) -> None:
    manifest = json.loads((p / "checkpoint-manifest.json").read_text())
    manifest["metadata"] = {"edited": True}
    (p / "checkpoint-manifest.json").write_text(json.dumps(manifest))


def _missing_key(p: Path) -> None:
    _rewrite(p, lambda s: s.pop("blocks.1.ffn.2.bias"))


def _extra_key(p: Path) -> None:
    _rewrite(p, lambda s: s.update({"blocks.0.cam_self_attn.q_proj.weight": torch.zeros(4, 4)}))


def _wrong_shape(p: Path) -> None:
    _rewrite(p, lambda s: s.update({"blocks.0.self_attn.q.weight": torch.zeros(64, 32)}))


def _other_family(p: Path) -> None:
    manifest = json.loads((p / "checkpoint-manifest.json").read_text())
    manifest["contract"]["family"] = "minimax_h3"
    (p / "checkpoint-manifest.json").write_text(json.dumps(manifest))
    _reseal(p)


def _mixed_prefix(p: Path) -> None:
    _rewrite(p, lambda s: s.update({"model.head.head.bias": s.pop("head.head.bias")}))


REFUSALS = {
    "no_complete": (_no_complete, "no COMPLETE.json"),
    "truncated": (_truncated, "not a readable torch checkpoint"),
    "size_mismatch": (_size_mismatch, "differs from the manifest's"),
    "hash_mismatch": (_hash_mismatch, "blake2s differs"),
    "missing_key": (_missing_key, "missing parameters (transformer, diffusers names): 1 (blocks.1.ffn.net.2.bias)"),
    "extra_key": (_extra_key, "no place in WanTransformer3DModel: 1 (blocks.0.cam_self_attn.q_proj.weight)"),
    "wrong_shape": (_wrong_shape, "blocks.0.attn1.to_q.weight has shape [64, 32]"),
    "mixed_prefix": (_mixed_prefix, "start with 'model.'"),
    "other_family": (_other_family, "contract family 'minimax_h3'; only 'wan22_ti2v_5b' packages convert"),
}


def _refused(args: list[str], out: Path, capsys, expect: str) -> None:
    """Exit 2, one stderr line naming the problem, no ``out`` and no staging folder beside it."""
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("solarwm convert official: error: "), err
    assert expect in err, err
    assert not out.exists()
    assert not list(out.parent.glob(f".{out.name}.*")) if out.parent.exists() else True


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_a_bad_package_is_refused_in_one_line(case, tiny_packages, tmp_path, capsys) -> None:
    damage, expect = REFUSALS[case]
    package = tiny_packages["stage0p5"]
    damage(package)
    out = tmp_path / "new" / "out"
    _refused(["convert", "official", str(package), "--out", str(out), "--architecture",
              tiny_packages["architecture"]], out, capsys, expect)
    assert not out.parent.exists()  # the parent it would have made is not left either


def test_a_code_payload_is_refused_and_never_runs(tmp_path, capsys) -> None:
    """``model.pt`` whose pickle calls ``os.system``: refused by ``weights_only``, the command never runs."""
    marker = tmp_path / "payload-ran"
    package = write_package(tmp_path / "evil", {"generator_ema": {"x": torch.zeros(1)}, "config": CodePayload(marker)})
    out = tmp_path / "out"
    _refused(["convert", "official", str(package), "--out", str(out)], out, capsys,
             "needs more than tensors and plain containers to load; refused, nothing executed")
    assert not marker.exists()


def test_architecture_mismatch_names_the_key(tiny_packages, tmp_path, capsys) -> None:
    """The default (published 5B) architecture does not fit a tiny package: the first key and shapes are named."""
    out = tmp_path / "out"
    _refused(["convert", "official", str(tiny_packages["stage0p5"]), "--out", str(out)], out, capsys,
             "has shape")
    bad = json.dumps(dict(TINY_ARCH, window_size=[1, 1]))
    _refused(["convert", "official", str(tiny_packages["stage0p5"]), "--out", str(out), "--architecture", bad],
             out, capsys, "unknown Wan field(s) ['window_size']")
    bad = json.dumps(dict(TINY_ARCH, in_dim=16))
    _refused(["convert", "official", str(tiny_packages["stage0p5"]), "--out", str(out), "--architecture", bad],
             out, capsys, "in_dim=16 (the route needs 48)")


def test_existing_out_and_missing_role_are_refused(tiny_packages, tmp_path, capsys) -> None:
    out = tmp_path / "taken"
    out.mkdir()
    assert main(["convert", "official", str(tiny_packages["stage0p5"]), "--out", str(out)]) == 2
    assert "exists" in capsys.readouterr().err and list(out.iterdir()) == []
    bad_role = tmp_path / "bad_role"
    args = ["convert", "official", str(tiny_packages["stage0p5"]), "--out", str(bad_role), "--weights", "best"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "weights" in err and not bad_role.exists()
    package = write_package(tmp_path / "live_only", {"generator": {"x": torch.zeros(1)}})
    _refused(["convert", "official", str(package), "--out", str(tmp_path / "o")], tmp_path / "o", capsys,
             "no 'generator_ema' state for role 'ema'")


def test_an_interrupted_conversion_leaves_nothing(tiny_packages, tmp_path, monkeypatch) -> None:
    """A Ctrl-C while the export is being written removes the staging folder; ``--out`` never appears."""
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    import safetensors.torch

    monkeypatch.setattr(safetensors.torch, "save_file", interrupted)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        convert.convert_official(tiny_packages["stage1"], out, architecture=tiny_packages["architecture"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["packages"]


def test_stage_package_written_by_the_fixture_is_a_valid_transaction(tiny_packages) -> None:
    """The fixture's packages pass the same verification the refusals fail (the refusals test one change each)."""
    for name in ("stage0p5", "stage1", "stage2"):
        package = convert.verify_package(tiny_packages[name])
        assert package.step == 1200 and package.default_role == "ema"
