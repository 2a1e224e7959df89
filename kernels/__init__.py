"""Attention kernels shared by every route: backend dispatch, fused PRoPE, block-causal masks."""

# Imported as the top-level package ``kernels`` (the repository root is on sys.path: ``python -m`` or ``python -c`` run
# from the checkout), this folder would shadow Hugging Face's ``kernels`` package, which transformers imports. It steps
# aside: the package of that name found on sys.path without the root takes its place in sys.modules, and ``import
# kernels`` returns that module (the import system reads sys.modules after this file runs).
if __name__ == "kernels":
    import importlib.machinery as _machinery
    import importlib.util as _util
    import os as _os
    import sys as _sys

    _root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
    _path = [p for p in _sys.path if _os.path.abspath(p or _os.getcwd()) != _root]
    _spec = _machinery.PathFinder.find_spec("kernels", _path)
    if _spec is None or _spec.loader is None:
        del _sys.modules["kernels"]
        raise ModuleNotFoundError("No module named 'kernels' (this folder is solarwm.kernels)", name="kernels")
    _module = _util.module_from_spec(_spec)
    _sys.modules["kernels"] = _module
    _spec.loader.exec_module(_module)
else:
    from .attention import AttentionBackendError, attention, available_backends, select_backend
    from .masks import (
        block_causal_block_mask,
        block_causal_mask,
        block_causal_mask_mod,
        causal_mask,
        frame_causal_block_mask,
        frame_causal_mask,
        frame_causal_mask_mod,
        teacher_forcing_block_mask,
        teacher_forcing_mask,
        teacher_forcing_mask_mod,
    )
    from .prope import PRoPEError, cameras_per_token, projective_matrices, prope_attention

    __all__ = [
        "AttentionBackendError",
        "PRoPEError",
        "attention",
        "available_backends",
        "block_causal_block_mask",
        "block_causal_mask",
        "block_causal_mask_mod",
        "cameras_per_token",
        "causal_mask",
        "frame_causal_block_mask",
        "frame_causal_mask",
        "frame_causal_mask_mod",
        "projective_matrices",
        "prope_attention",
        "select_backend",
        "teacher_forcing_block_mask",
        "teacher_forcing_mask",
        "teacher_forcing_mask_mod",
    ]
