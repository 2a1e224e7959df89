"""Lane ``tests/backbones``: The route adapters (``solarwm.backbones``): the contract suite over every route,
each route's own checks, LoRA, growth and FSDP wrapping.

Shared fixtures: ``tests/conftest.py``; helpers: ``tests/support/``. What to run when: ``tests/README.md``.
"""
