"""Lane ``tests/stages``: The three stages as LightningModules and their callbacks (``solarwm.stages``,
``solarwm.callbacks``).

Shared fixtures: ``tests/conftest.py``; helpers: ``tests/support/``. What to run when: ``tests/README.md``.
"""
