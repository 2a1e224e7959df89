"""Annotation stages of the data engine (paper §5.2, §5.4): ``solarwm data annotate``.

``registry`` defines what a stage is (its keys, options and hooks) and registers stages by name;
``stages`` is the package of stage modules (the built-ins camera, saturation, vmaf, cuts, flow,
dover, vlm in ``stages.builtin``), ``visual`` and ``vlm`` the metric implementations, ``runner`` the
executor and CLI function. Import those modules directly; this package import stays cheap.
"""
