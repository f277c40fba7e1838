"""AutoGraph: equivalent graph substitutions searched jointly with the inter-operator schedule.

* :mod:`.search` — the search (:func:`autograph_search`): flow partition, backtracking per subgraph, DP over
  subgraphs, top-k verification under the real cost model;
* :mod:`.flow_partition` — minimum-cut partition by substitution capacity;
* :mod:`.estimate` — the mixed critical-path estimate of a graph before TVM fuses it;
* :mod:`.region` — a subgraph of ``main`` as a module of its own.

The substitutions themselves are in :mod:`passes.substitutions`.
"""
from .flow_partition import Partition, flow_partition
from .search import AutographResult, Candidate, autograph_search, estimate_cost

__all__ = ["AutographResult", "Candidate", "Partition", "autograph_search", "estimate_cost", "flow_partition"]
