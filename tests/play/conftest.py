"""Lane ``tests/play``: The browser world and the Gymnasium environment (``solarwm.play``, ``solarwm.envs``).

Shared fixtures: ``tests/conftest.py``; helpers: ``tests/support/``. What to run when: ``tests/README.md``.
"""
