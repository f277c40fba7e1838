"""Graph substitutions on high-level Relax (issue 14, AutoGraph): rules that rewrite ``main`` into an
equivalent graph with different parallelism, for a search over rewritten graphs + schedules.

Use::

    mod = ensure_unique_names(mod)
    for m in find_matches(mod):            # Match(rule, nodes, params)
        new = apply_match(mod, m)          # numerically proved on the region first (cached)

Each rule module registers its rules in :data:`RULES` on import.
"""
from . import fuse, matmuls, merge_convs, split  # noqa: F401  (import registers the rules)
from .base import RULES, Match, Rule, apply_match, find_matches, register
from .check import check_match, clear_check_cache, extract_region
from .graph import (
    Node,
    SubstitutionError,
    dataflow_nodes,
    ensure_unique_names,
    fold_constants,
    rewrite_main,
)

__all__ = [
    "RULES",
    "Match",
    "Node",
    "Rule",
    "SubstitutionError",
    "apply_match",
    "check_match",
    "clear_check_cache",
    "dataflow_nodes",
    "ensure_unique_names",
    "extract_region",
    "find_matches",
    "fold_constants",
    "register",
    "rewrite_main",
]
