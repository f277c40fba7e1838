"""The demo: one model, the best available scheduler vs sequential, same kernels, same machine.

Both programs are compiled from the same prepared module, so the only difference is the inter-operator
schedule. Latencies are medians over interleaved repeats (the machine is shared and noisy).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import tvm_interop  # noqa: E402
from tvm_interop.passes.schedulers import available_schedulers  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="inception_v3")
    ap.add_argument("--width", type=float, default=0.5, help="channel multiplier (default 0.5: keeps the demo short)")
    ap.add_argument("--image-size", type=int, default=149, help="input resolution (default 149)")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--out", default="out")
    args = ap.parse_args()
    best = next(s for s in ("ios", "lios", "greedy") if s in available_schedulers())
    os.makedirs(args.out, exist_ok=True)
    t0 = time.perf_counter()
    print(f"[demo] model {args.model} (width {args.width}, {args.image_size}px), scheduler {best}", flush=True)
    mod, name = tvm_interop.load_module(args.model, image_size=args.image_size, width=args.width)
    program = tvm_interop.api.prepare_program(mod, name=name)
    print(f"[demo] {len(program.graph)} units after TVM legalize + fusion ({time.perf_counter() - t0:.1f} s)",
          flush=True)
    models = {}
    for sched in ("sequential", best):
        t = time.perf_counter()
        # the best scheduler asks this CPU (measured stage costs, cached in out/) and is guarded against sequential
        kw = dict(cost="measured", cost_cache=os.path.join(args.out, "cost-cache.json")) if sched != "sequential" else {}
        models[sched] = tvm_interop.compile(mod, scheduler=sched, name=name, **kw)
        s = models[sched].schedule
        print(f"[demo] {sched:10s}: {s.num_stages} stages, up to {s.max_concurrency()} concurrent groups "
              f"(compiled in {time.perf_counter() - t:.1f} s)", flush=True)
        g = models[sched].guard
        if g is not None:
            verdict = "kept" if g.keep_schedule else "rejected: shipping sequential"
            print(f"[demo] never-slower guard: {g.scheduled_ms:.2f} ms vs sequential {g.sequential_ms:.2f} ms "
                  f"(noise {g.noise * 100:.0f}%) -> {verdict}", flush=True)
    x = models[best].random_inputs(seed=0)
    ref = tvm_interop.run_reference(mod, x)
    for sched, cm in models.items():
        err = float(np.max(np.abs(cm.run(*x) - ref)))
        print(f"[demo] {sched:10s}: max |out - plain TVM| = {err:.2e}")
    times = {k: [] for k in models}
    for _ in range(2):  # warm-up
        for cm in models.values():
            cm.run(*x)
    for _ in range(args.repeat):  # interleaved repeats
        for k, cm in models.items():
            t = time.perf_counter()
            cm.run(*x, numpy=False)
            times[k].append(time.perf_counter() - t)
    med = {k: float(np.median(v)) for k, v in times.items()}
    print(f"[demo] sequential   {med['sequential'] * 1e3:9.2f} ms (median of {args.repeat})")
    shipped = models[best].schedule.scheduler
    print(f"[demo] {best:12s} {med[best] * 1e3:9.2f} ms  -> speedup {med['sequential'] / med[best]:.2f}x "
          f"(shipped schedule: {shipped}{'' if shipped == best else ', chosen by the never-slower guard'})")
    sched_path = os.path.join(args.out, f"{name}.schedule.json")
    so_path = os.path.join(args.out, f"{name}.so")
    models[best].schedule.measured_latency = med[best]
    models[best].schedule.save(sched_path)
    models[best].export(so_path)
    with open(os.path.join(args.out, f"{name}.demo.json"), "w") as f:
        json.dump({"model": name, "scheduler": best, "median_ms": {k: v * 1e3 for k, v in med.items()},
                   "speedup": med["sequential"] / med[best], "repeat": args.repeat, "shipped": shipped,
                   "width": args.width, "image_size": args.image_size}, f, indent=1)
    print(f"[demo] wrote {sched_path} and {so_path}; try: .venv/bin/tvm-interop run {so_path}")
    print(f"[demo] total {time.perf_counter() - t0:.1f} s")
    for cm in models.values():
        cm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
