"""Backbone adapters: one module per route, all speaking ``solarwm.backbones.base.BackboneAdapter``."""

from solarwm.backbones.base import ROUTES, AdapterError, BackboneAdapter, load_adapter, route_class
from solarwm.backbones.lora import LoRAConfig

__all__ = ["ROUTES", "AdapterError", "BackboneAdapter", "LoRAConfig", "load_adapter", "route_class"]
