"""Pure loss math (no Lightning, no route imports), below both ``solarwm.stages`` and ``solarwm.backbones``.

``rng``: per-sample random streams (``SampleRNG``); ``flow_matching``: rectified-flow interpolation, target,
shift, timestep sampling and weighting; ``flow_map``: the AnyFlow flow-map objective (eq. 2); ``dmd``: the DMD
gradient and surrogate (eq. 3).
"""
