"""Lane ``tests/kernels``: Attention backends, masks, fused PRoPE and the KV cache (``solarwm.kernels``).

Shared fixtures: ``tests/conftest.py``; helpers: ``tests/support/``. What to run when: ``tests/README.md``.
"""
