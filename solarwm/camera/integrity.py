"""The one camera-integrity check (paper §5.2): finite geometry, FOV, focal consistency, scale stability.

Both the annotation stage and any reader that needs these numbers call ``camera_integrity``;
the policy engine gates on its keys and fails closed on anything absent or non-finite.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from solarwm.camera.intrinsics import focal_divergence, fov_deg

# What meta.pose_units may say: metric, or relative (translation known up to one global scale).
POSE_UNITS = ("metric", "relative")


def camera_integrity(
    c2w: Any, K: Any, width: int, height: int, scale: Any = None, pose_units: str = "metric"
) -> dict[str, Any]:
    """Camera metrics of one clip: c2w ``[N, 4, 4]``, K ``[N, 4]`` pixels, optional per-frame scales ``[N]``.

    Returns ``camera.finite`` (bool) always. The numeric keys (``camera.fov_x_min``,
    ``camera.fov_x_max``, ``camera.fov_y_min``, ``camera.fov_y_max``, ``camera.focal_div_max``,
    ``camera.scale_cov``) are present only when they are defined and finite: a clip with
    non-finite poses or non-positive focals gets ``camera.finite = False`` and no FOV keys, so
    no downstream gate can pass on it. ``scale`` is the per-frame factor that made the poses
    metric (e.g. a Sim(3) fit); ``None`` means the poses were metric at ingestion, so the
    coefficient of variation is exactly 0.

    ``pose_units`` (``meta.pose_units`` of the clip) is echoed as ``camera.pose_units``. For
    ``"relative"`` poses (known only up to one global scale, e.g. from structure from motion)
    there is no metric scale to be stable, so ``camera.scale_cov`` is left out: the gates that
    need metric scale fail closed, and the camera gate names ``camera.pose_units=relative``.
    """
    if pose_units not in POSE_UNITS:
        raise ValueError(f"pose_units must be one of {POSE_UNITS}, got {pose_units!r}")
    c2w = np.asarray(c2w, dtype=np.float64)
    K = np.asarray(K, dtype=np.float64)
    finite = bool(
        c2w.ndim == 3 and c2w.shape[1:] == (4, 4) and K.ndim == 2 and K.shape[1] == 4
        and len(c2w) == len(K) and len(K) > 0
        and np.isfinite(c2w).all() and np.isfinite(K).all()
        and (K[:, :2] > 0).all()
    )
    out: dict[str, Any] = {"camera.finite": finite, "camera.pose_units": pose_units}
    if not finite:
        return out
    fov_x, fov_y = fov_deg(K, width, height)
    out["camera.fov_x_min"] = float(fov_x.min())
    out["camera.fov_x_max"] = float(fov_x.max())
    out["camera.fov_y_min"] = float(fov_y.min())
    out["camera.fov_y_max"] = float(fov_y.max())
    out["camera.focal_div_max"] = float(focal_divergence(K).max())
    if pose_units != "metric":
        pass  # no metric scale: scale_cov is undefined, and absent keys fail closed
    elif scale is None:
        out["camera.scale_cov"] = 0.0
    else:
        s = np.asarray(scale, dtype=np.float64)
        if s.size and np.isfinite(s).all() and abs(s.mean()) > 0:
            out["camera.scale_cov"] = float(s.std() / abs(s.mean()))
    return out
