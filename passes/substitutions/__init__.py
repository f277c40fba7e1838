"""Graph substitutions on high-level Relax (issue 14, AutoGraph): rules that rewrite ``main`` into an
equivalent graph with different parallelism, for a search over rewritten graphs + schedules.

Use::

    mod = fold_constants(mod)              # or ensure_unique_names(mod) when weights are constants already
    for m in find_matches(mod):            # Match(rule, nodes, params)
        new = apply_match(mod, m)          # numerically proved on the region first (cached)

Rules (each module registers its rules in :data:`RULES` on import):

* ``merge_convs``: ``merge_shared_input_convs``, ``merge_concat_convs``, ``merge_added_convs``
* ``fuse``: ``fuse_1x1_sequence``
* ``matmuls``: ``merge_shared_input_matmuls``
* ``split``: ``split_conv``, ``split_matmul`` (the inverses, for an under-filled device)

Layout: ``graph`` (the dataflow view, :class:`Node`, names, the one rewrite primitive :func:`rewrite_main`),
``base`` (:class:`Match`, :class:`Rule`, the registry), ``check`` (the numeric proof), ``apply``
(:func:`apply_match`),
``chains`` (conv/matmul + bias + relu chains, kernel alignment). Compile time only: nothing here is needed to
run a model.
"""
from . import fuse, matmuls, merge_convs, split  # noqa: F401  (import registers the rules)
from .apply import apply_match
from .base import RULES, Match, Rule, find_matches, register
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
