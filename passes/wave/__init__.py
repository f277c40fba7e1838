"""Rammer's wave fusion: the groups of a concurrent stage compiled into one kernel (one parallel region on a CPU,
one launch on a GPU), orthogonal to the scheduler that chose the stages. See ``apply`` for the program rewrite,
``kernel`` for the fused kernel, ``cpu`` / ``cuda`` for the code generators and ``partition`` for the arithmetic."""
from .apply import WaveRecord, apply_wave_fusion, fusable_stages
from .choose import choose_wave_stages, wave_stages
from .lowered import NotFusable

__all__ = ["apply_wave_fusion", "choose_wave_stages", "wave_stages", "fusable_stages", "WaveRecord", "NotFusable"]
