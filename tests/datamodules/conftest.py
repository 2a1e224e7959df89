"""Lane ``tests/datamodules``: The model view (``solarwm.datamodules``): clip windows, the latent-cache view.

Shared fixtures: ``tests/conftest.py``; helpers: ``tests/support/``. What to run when: ``tests/README.md``.
"""
