"""What a Relax function issues: its calls of external (packed) functions, and, for the as-built IR, its ops in
binding order, which the stream tests compare with the lowering's plan (the thing that ships, not the plan)."""
from __future__ import annotations

from tvm import relax

from tvm_interop.passes.lower_streams import EVENT_SYNC, SET, SYNC, TIMING_RECORD


def extern_calls(func, name: str) -> list:
    """Every call of the packed function ``name`` in ``func`` (any depth)."""
    found = []

    def visit(e):
        if isinstance(e, relax.Call) and isinstance(e.op, relax.ExternFunc) and str(e.op.global_symbol) == name:
            found.append(e)

    relax.analysis.post_order_visit(func.body, visit)
    return found


def issued_ops(func, kernel_names: set[str]) -> list[tuple]:
    """("sync",) (TVM's per-call event or a reused one), ("set",), ("timed", k) (stage-timing event k) and
    ("kernel", name) for the calls of ``kernel_names``."""
    out = []
    for block in func.body.blocks:
        for b in block.bindings:
            v = b.value
            if not isinstance(v, relax.Call):
                continue
            if isinstance(v.op, relax.ExternFunc):
                sym = str(v.op.global_symbol)
                if sym in (SYNC, EVENT_SYNC):
                    out.append(("sync",))
                elif sym == SET:
                    out.append(("set",))
                elif sym == TIMING_RECORD:
                    out.append(("timed", int(v.args[1].value)))
            elif isinstance(v.op, relax.GlobalVar) and v.op.name_hint in kernel_names:
                out.append(("kernel", v.op.name_hint))
    return out
