"""Inter-operator schedulers. Each registers itself by name; ``schedule_graph`` is the driver."""
from .base import SearchStats, annotate_latency, available_schedulers, get_scheduler, register_scheduler, schedule_graph

__all__ = ["SearchStats", "annotate_latency", "available_schedulers", "get_scheduler", "register_scheduler",
           "schedule_graph"]
