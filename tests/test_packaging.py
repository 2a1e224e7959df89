"""What the project's own files install: exactly one OpenCV wheel (they share the one `cv2` module)."""

from __future__ import annotations

from importlib import metadata

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
