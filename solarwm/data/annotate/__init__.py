"""Annotation stages of the data engine (paper §5.2, §5.4): ``solarwm data annotate``.

``stages`` defines the per-clip stages (camera, saturation, vmaf, cuts, flow, dover, vlm),
``visual`` and ``vlm`` the metric implementations, ``runner`` the executor and CLI function.
Import those modules directly; this package import stays cheap.
"""
