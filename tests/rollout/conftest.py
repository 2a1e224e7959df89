"""Lane ``tests/rollout``: The block-causal rollout engine and the stepwise session (``solarwm.rollout``).

Shared fixtures: ``tests/conftest.py``; helpers: ``tests/support/``. What to run when: ``tests/README.md``.
"""
