"""``tvm-interop models``: the model zoo with unit counts."""
from __future__ import annotations

from .common import print_json


def register(sub) -> None:
    p = sub.add_parser("models", help="list the built-in models with their operator (unit) counts")
    p.add_argument("--no-count", action="store_true", help="skip counting units (fast)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    """One row per model, printed as soon as it is counted (counting all seven takes about 40 s on 2 cores)."""
    from tvm_interop.models import MODELS

    rows = []
    for name, spec in MODELS.items():
        row = {"name": name, "image_size": spec.default_image_size, "description": spec.description,
               "source": spec.source}
        if not args.no_count:
            row["units"] = count_units(name)
        rows.append(row)
        if not args.json:
            units = f"{row['units']:5d} units" if "units" in row else ""
            print(f"{row['name']:16s} {row['image_size']:4d}px {units}  {row['description']}", flush=True)
    if args.json:
        print_json(rows)
        return 0
    if not args.no_count:
        print("(units = fused TVM kernels the scheduler places on this CPU, counted on a narrow copy — the count "
              "depends on structure, not width; for CUDA it differs: NCHW throughout, no layout conversions)")
    return 0


def count_units(name: str) -> int:
    """Unit count of a zoo model. Width does not change the graph, so count on a narrow copy (fast folding)."""
    from tvm_interop.api import prepare_program
    from tvm_interop.models import get_model

    return len(prepare_program(get_model(name, width=0.0625)).graph)
