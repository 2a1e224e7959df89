"""Lane ``tests/camera``: SE(3), conventions, intrinsics, trajectories, the camera controller and the pixel
convention (``solarwm.camera``).

Shared fixtures: ``tests/conftest.py``; helpers: ``tests/support/``. What to run when: ``tests/README.md``.
"""
