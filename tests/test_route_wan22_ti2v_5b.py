"""The adapter contract suite (tests/route_contract.py) on the tiny Wan2.2-TI2V-5B route."""

from __future__ import annotations

import torch

import route_contract as contract
from solarwm.backbones.wan22_ti2v_5b import Wan22TI2V5BAdapter, Wan22TI2V5BConfig


def adapter() -> Wan22TI2V5BAdapter:
    torch.manual_seed(0)
    built = Wan22TI2V5BAdapter(config=Wan22TI2V5BConfig.tiny())
    contract.perturb(built)
    return built


def test_contract_geometry_cache_teacher_forcing_export(tmp_path):
    a = adapter()
    batch = contract.make_batch(a, num_frames=4 * 5 + 1, height=32, width=32)  # 6 latent frames = 2 blocks
    contract.check_geometry(a, batch)
    contract.check_cache_exact(a, batch)
    contract.check_teacher_forcing_matches_rollout(a, batch)
    contract.check_export_round_trip(a, batch, tmp_path / "export")
