"""Lane ``tests/cli``: The recipe parser and the ``solarwm`` verbs end to end (``solarwm.lightning_cli``,
``solarwm.train_cli``, ``solarwm.cli``).

Shared fixtures: ``tests/conftest.py``; helpers: ``tests/support/``. What to run when: ``tests/README.md``.
"""
