"""Maps cost-model specs (``kind[:arg]``) to constructors; other modules register themselves here."""
from __future__ import annotations

from typing import Callable

from tvm_interop.runtime.errors import InteropError

from .base import CostModel, UnitCostModel

_FACTORIES: dict[str, Callable[..., CostModel]] = {}


def register(kind: str, factory: Callable[..., CostModel]) -> None:
    _FACTORIES[kind] = factory


def make(spec: str, **kwargs) -> CostModel:
    kind, _, arg = spec.partition(":")
    _load_builtin()
    if kind not in _FACTORIES:
        raise InteropError(f"unknown cost model {spec!r}; known kinds: {sorted(_FACTORIES)}")
    return _FACTORIES[kind](arg, **kwargs) if arg else _FACTORIES[kind](**kwargs)


def default_spec(device_kind: str) -> str:
    """The cost spec a compile uses when none is given: the simulated preset for the device kind (``cpu`` ->
    ``sim:cpu``, a GPU -> ``sim:h100``), or ``unit`` when the simulator is not available."""
    if "sim" not in known():
        return "unit"
    return "sim:cpu" if device_kind == "cpu" else "sim:h100"


def known() -> list[str]:
    _load_builtin()
    return sorted(_FACTORIES)


def _load_builtin() -> None:
    if "unit" not in _FACTORIES:
        register("unit", lambda **kw: UnitCostModel(**kw))
    # simulated / measured cost models register themselves when their modules exist
    import importlib

    for mod in ("simulated", "measured", "table", "learned"):
        try:
            importlib.import_module(f"{__package__}.{mod}")
        except ModuleNotFoundError as e:
            if e.name != f"{__package__}.{mod}":
                raise
