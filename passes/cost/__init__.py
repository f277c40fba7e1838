"""Cost models: one interface (``CostModel``), several implementations."""
from .base import CostModel, UnitCostModel

__all__ = ["CostModel", "UnitCostModel", "get_cost_model"]


def get_cost_model(spec: "str | CostModel | None", **kwargs) -> CostModel:
    """Turn a spec such as ``"unit"`` or ``"sim:h100"`` into a cost model (objects pass through)."""
    if spec is None:
        return UnitCostModel()
    if isinstance(spec, CostModel):
        return spec
    from . import registry

    return registry.make(spec, **kwargs)
