"""Per-owner selection policies (paper §5.5, Table 3) -> tiers (xhigh / high / rejected) + reasons."""

from solarwm.data.policy.engine import Selection, evaluate
from solarwm.data.policy.spec import COLUMNS, OWNERS, TIERS, Check, Policy, PolicyError, load_policy, parse_policy

__all__ = ["COLUMNS", "OWNERS", "TIERS", "Check", "Policy", "PolicyError", "Selection", "evaluate", "load_policy",
           "parse_policy"]
