"""Lane ``tests/loading``: Loading a model and a first frame for inference (``solarwm.loading``).

Shared fixtures: ``tests/conftest.py``; helpers: ``tests/support/``. What to run when: ``tests/README.md``.
"""
