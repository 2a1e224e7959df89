"""Lane ``tests/metrics``: Scoring (``solarwm.metrics``): video metrics, camera following and its determinism.

Shared fixtures: ``tests/conftest.py``; helpers: ``tests/support/``. What to run when: ``tests/README.md``.
"""
