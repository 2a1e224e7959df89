"""Lane ``tests/data``: The data engine (``solarwm.data``): the clip contract, synth, ingest, annotate, policy,
pack, recipe, report.

Shared fixtures: ``tests/conftest.py``; helpers: ``tests/support/``. What to run when: ``tests/README.md``.
"""
