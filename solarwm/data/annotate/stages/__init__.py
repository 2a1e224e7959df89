"""The annotation stages: every module of this package registers its stages on import (paper §5.2, §5.4).

``builtin`` (camera, saturation, vmaf, cuts, flow, dover, vlm) is imported first, so they keep their
order; then every other module here, by name. A new stage is one module in this package that calls
``register_stage`` (see docs/adding-an-annotation-stage.md); nothing else lists the stages. Workers
import this package too, so a stage registered here exists in every process and Ray task. Keep a
stage module's heavy imports (torch, model code) inside its functions: every command that reads the
policy columns imports this package.
"""

from __future__ import annotations

import importlib
import pkgutil

from solarwm.data.annotate.registry import (
    STAGES,
    AnnotateConfig,
    AnnotateConfigError,
    ClipContext,
    Option,
    Stage,
    StageSkipped,
    default_stages,
    register_stage,
    stage_options,
    unregister_stage,
)
from solarwm.data.annotate.stages import builtin

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    if _module != "builtin" and not _module.startswith("_"):
        importlib.import_module(f"{__name__}.{_module}")

__all__ = ["STAGES", "AnnotateConfig", "AnnotateConfigError", "ClipContext", "Option", "Stage", "StageSkipped",
           "builtin", "default_stages", "register_stage", "stage_options", "unregister_stage"]
