"""What the project's own files install: exactly one OpenCV wheel (they share the one `cv2` module)."""

from __future__ import annotations

from importlib import metadata

import pytest

OPENCV_WHEELS = ("opencv-python", "opencv-python-headless", "opencv-contrib-python", "opencv-contrib-python-headless")


def test_exactly_one_opencv_wheel_is_installed() -> None:
    installed = []
    for name in OPENCV_WHEELS:
        try:
            metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        installed.append(name)
    assert installed == ["opencv-python-headless"], (
        f"OpenCV wheels installed: {installed}; two wheels overwrite each other's cv2 files "
        "(pip uninstall the extra one; pyproject pins scenedetect[opencv-headless] < 0.7 for this)"
    )


@pytest.mark.slow
def test_diffusers_models_import_with_the_repository_root_on_sys_path() -> None:
    # `python -m pytest` and `python -m solarwm...` put the repository root on sys.path, where our top-level
    # `kernels/` folder (solarwm.kernels) shadows Hugging Face's `kernels` package. transformers 5.25 requires that
    # package and imports names from it, so every diffusers model import failed (pyproject pins transformers < 5.25).
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    code = "import diffusers.models.autoencoders.autoencoder_kl_wan, transformers.integrations.hub_kernels"
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
