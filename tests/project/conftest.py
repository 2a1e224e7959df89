"""Lane ``tests/project``: The project as a whole: the layer order, docs references, packaging, the installed
package, benchmarks.

Shared fixtures: ``tests/conftest.py``; helpers: ``tests/support/``. What to run when: ``tests/README.md``.
"""
