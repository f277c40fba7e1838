#!/usr/bin/env python3
"""Every fused stage's wave kernel (or every flow run's launch) against its members run alone, on the device.

Why: gpu_check compares a whole program's output with plain TVM, which says *that* a wave variant is wrong but not
which stage. On an H100 every ``greedy+wave`` / ``lios+wave`` variant of RandWire and NASNet-A-mobile was wrong
while each member kernel alone was right; this check named the 5 stages of 205 that were, and the CPU emulation in
``tests/test_wave.py`` then reproduced the cause (a repacked member's index, simplified wrongly by TVM).

    build (here, TVM's compiler + nvcc):  python scripts/gpu_wave_diff.py build --models randwire,nasnet_a_mobile
    run (the GPU machine, TVM's runtime only): one call of the device tool with carry [".wave_diff", ".gpu_check"]
        bash scripts/gpu_check.sh wave-diff randwire nasnet_a_mobile

``build`` writes, per model, one library holding each fused stage's wave kernel (``s<stage>_wave``) and every
member kernel alone (``s<stage>_<unit>``, scheduled as the build schedules it), and a JSON of how to call them.
``run`` feeds each stage random inputs, runs the members in chain order and the wave kernel, and writes
``OUT/wave_diff.json``: per stage the largest difference, and the stages (units) over 1e-4. ``--target llvm``
builds CPU wave kernels, which the same ``run`` checks on the CPU (the tests do).

``build --fusion flow`` does the same for flow runs (``passes/wave/flow.py``, CUDA only): each run's launch
(``r<first stage>_flow``, with the device functions it calls), and the same run coarsened (``r<first
stage>_flow_coarse``: gpu_check's ``X+flow_coarse``), beside its members alone. ``run`` passes each launch
zeroed counters, as the program's zeroing kernel does, and checks afterwards that every task was taken and
counted. Every member output is an output of a flow launch, so the report lists every unit of a run whose output
differs, in order; the first is where the run goes wrong (the later ones may only read its output).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOL = 1e-4


def _member_entry(program, u: str, sig, fname: str) -> dict:
    """How ``run`` calls unit ``u``'s kernel alone: its arguments (a run input, or an earlier member's output)."""
    call = program.calls[u]
    args = [["unit", r.unit, r.index] if r.kind == "unit" and r.unit in sig.units else ["in", sig.inputs.index(r)]
            for r in call.args]
    return {"func": fname, "unit": u, "args": args, "outs": [([int(d) for d in o.shape], o.dtype)
                                                              for o in call.outputs]}


def _input_shapes(program, sig) -> list:
    shapes = []
    for ref in sig.inputs:
        owner = next(u for u in sig.units if ref in program.calls[u].args)
        call = program.calls[owner]
        p = program.mod[call.func_name].params[call.args.index(ref)]
        shapes.append(([int(d) for d in p.shape], str(p.dtype)))
    return shapes


def _flow_stages(program, sched, target) -> tuple[dict, list]:
    """The flow runs of ``sched``: their launches (with the subroutines they call) and members alone, by GlobalVar,
    and their entries for ``run``."""
    import tvm

    from tvm_interop.passes.cuda_build import scheduled_as_built
    from tvm_interop.passes.wave import flow as F

    records, kernels = F.plan_flow_runs(program, sched, target)
    funcs, stages = {}, []
    for rec in records:
        if not rec.units:
            continue
        first = rec.stages[0]
        members = None
        # the run's launch as gpu_check's X+flow builds it, and coarsened as X+flow_coarse does, beside one
        # kernel per function that both share (NASNet-A-mobile's runs: 550 launches of 119 functions)
        for coarsen, name in ((False, f"r{first}_flow"), (True, f"r{first}_flow_coarse")):
            kern = F.build_flow_kernel(program, rec.units, target, kernels, name, coarsen=coarsen)
            sig = kern.signature
            funcs[tvm.ir.GlobalVar(name)] = kern.func.with_attr("global_symbol", name)
            for sub in kern.subroutines:
                funcs[sub.gvar] = sub.func
            if members is None:   # the members alone: one kernel per function, the same for both launches
                members, alone = [], set()
                for u in rec.units:
                    func_name = program.calls[u].func_name
                    fname = f"r{first}_{func_name}"
                    if func_name not in alone:
                        alone.add(func_name)
                        func = scheduled_as_built(program.mod[func_name], target)
                        funcs[tvm.ir.GlobalVar(fname)] = func.with_attr("global_symbol", fname)
                    members.append(_member_entry(program, u, sig, fname))
            stages.append({"stage": first, "stages": rec.stages, "wave": name, "coarsen": coarsen,
                           "groups": [list(rec.units)], "inputs": _input_shapes(program, sig),
                           "flags": kern.num_flags,
                           "tasks": kern.layout.final_counters(), "gave_up": F.gave_up_index(len(kern.members)),
                           "outputs": [[u, i] for u, i in sig.outputs], "members": members})
    return funcs, stages


def check_counters(row: dict, counted: list[int], st: dict) -> None:
    """A flow launch's counters read back after it ran, against the build's expectation ``st["tasks"]``: every task
    taken once and counted by its member (else blocks ran short or twice: ``counters_ok``), and, in builds since
    ``FLOW_CODEGEN`` 3, no wait given up (``waits_given_up``: a wrong number then comes from a wait cut short, not
    from memory one SM read stale). Each failure is added to ``row["bad"]``."""
    given_up = st.get("gave_up")
    if given_up is not None:
        row["waits_given_up"] = counted[given_up]
        if counted[given_up]:
            row["bad"].append(["waits given up", counted[given_up]])
    keep = [i for i in range(len(st["tasks"])) if i != given_up]
    row["counters_ok"] = len(counted) == len(st["tasks"]) and all(counted[i] == st["tasks"][i] for i in keep)
    if not row["counters_ok"]:
        row["bad"].append(["counters", sum(1 for i in keep if i >= len(counted) or counted[i] != st["tasks"][i])])


def build(models: list[str], out_dir: str, target_spec: str, scheduler: str = "greedy",
          model_kwargs: dict | None = None, fusion: str = "wave") -> None:
    import tvm

    from tvm_interop.api import prepare_program
    from tvm_interop.models import get_model
    from tvm_interop.passes.schedulers import schedule_graph
    from tvm_interop.passes.target import normalize_target
    from tvm_interop.passes.wave.apply import fusable_stages, fusion_program, plan_wave_stage
    from tvm_interop.passes.cuda_build import scheduled_as_built

    target = normalize_target(target_spec)
    gpu = target.kind.name == "cuda"
    if fusion == "flow" and not gpu:
        raise SystemExit("gpu_wave_diff: flow runs are CUDA launches; --fusion flow needs a CUDA target")
    os.makedirs(out_dir, exist_ok=True)
    for name in models:
        program = prepare_program(get_model(name, **(model_kwargs or {})), target, name=name)
        cost = "sim:h100" if gpu else "sim:cpu"
        sched = schedule_graph(program.graph, scheduler, cost, model_name=name)
        program = fusion_program(program, target)   # what apply_wave_fusion fuses (CPU: repacked weights)
        funcs, stages = {}, []
        if fusion == "flow":
            funcs, stages = _flow_stages(program, sched, target)
        for si in (fusable_stages(sched) if fusion == "wave" else []):
            kernel, rec = plan_wave_stage(program, sched.stages[si].groups, target)
            if kernel is None:
                continue
            sig = kernel.signature
            wave = f"s{si}_wave"
            funcs[tvm.ir.GlobalVar(wave)] = kernel.func.with_attr("global_symbol", wave)
            members = []
            for group in rec.fused:
                for u in group:
                    func = program.mod[program.calls[u].func_name]
                    if gpu:
                        func = scheduled_as_built(func, target)
                    fname = f"s{si}_{u}"
                    funcs[tvm.ir.GlobalVar(fname)] = func.with_attr("global_symbol", fname)
                    members.append(_member_entry(program, u, sig, fname))
            stages.append({"stage": si, "wave": wave, "groups": rec.fused, "inputs": _input_shapes(program, sig),
                           "outputs": [[u, i] for u, i in sig.outputs], "members": members})
        mod = tvm.IRModule(funcs)
        if gpu:   # the flow runs' subroutines: private device functions, as the product's CUDA build leaves them
            from tvm_interop.passes.wave.subroutine import keep_device_subroutines

            mod = keep_device_subroutines(target)(mod)
        with target:
            lib = tvm.tirx.build(mod, target=target)
        path = os.path.join(out_dir, f"{name}.so")
        if gpu:
            from tvm_interop.passes.cuda_compile import export_cuda_library
            from tvm_interop.passes.target import requested_arches

            export_cuda_library(lib, path, list(requested_arches(target)))
        else:
            lib.export_library(path)
        with open(os.path.join(out_dir, f"{name}.json"), "w", encoding="utf-8") as f:
            json.dump({"target": target.kind.name, "scheduler": scheduler, "fusion": fusion, "stages": stages}, f)
        print(f"{name}: {len(stages)} fused {'stages' if fusion == 'wave' else 'runs'}, {len(funcs)} functions -> "
              f"{path}", flush=True)


def run(models: list[str], in_dir: str, out_dir: str) -> dict:
    import numpy as np
    import tvm

    report = {}
    for name in models:
        with open(os.path.join(in_dir, f"{name}.json"), encoding="utf-8") as f:
            spec = json.load(f)
        if spec["target"] == "cuda":
            from tvm_interop.runtime.cuda import check_cuda_device, ensure_cuda_runtime

            ensure_cuda_runtime()
            dev = check_cuda_device(0)
        else:
            dev = tvm.cpu(0)
        lib = tvm.runtime.load_module(os.path.join(in_dir, f"{name}.so"))
        rng = np.random.default_rng(0)
        rows = []
        for st in spec["stages"]:
            ins = [tvm.runtime.tensor(rng.standard_normal(s).astype(t), dev) for s, t in st["inputs"]]
            alone = {}
            for m in st["members"]:
                args = [alone[(a[1], a[2])] if a[0] == "unit" else ins[a[1]] for a in m["args"]]
                outs = [tvm.runtime.tensor(np.zeros(s, t), dev) for s, t in m["outs"]]
                lib[m["func"]](*args, *outs)
                for i, o in enumerate(outs):
                    alone[(m["unit"], i)] = o
            fused = [tvm.runtime.tensor(np.zeros(alone[(u, i)].shape, alone[(u, i)].dtype), dev)
                     for u, i in st["outputs"]]
            # a flow launch takes its counters, zeroed (what the program's zeroing kernel does), after the inputs
            flags = [tvm.runtime.tensor(np.zeros(st["flags"], "int32"), dev)] if "flags" in st else []
            lib[st["wave"]](*ins, *flags, *fused)
            dev.sync()
            errs = [float(np.max(np.abs(f.numpy() - alone[(u, i)].numpy())))
                    for f, (u, i) in zip(fused, st["outputs"])]
            bad = [[u, e] for (u, _), e in zip(st["outputs"], errs) if not e <= TOL]
            row = {"stage": st["stage"], "launch": st["wave"], "groups": st["groups"], "max_err": max(errs),
                   "bad": bad}
            if flags:
                check_counters(row, [int(v) for v in flags[0].numpy()], st)
            rows.append(row)
            if row["bad"]:
                print(f"{name}: stage {st['stage']} ({st['wave']}) wrong: {row['bad']}", flush=True)
        report[name] = {"device": str(dev), "scheduler": spec["scheduler"], "fusion": spec.get("fusion", "wave"),
                        "stages": rows,
                        "wrong": sum(1 for r in rows if r["bad"])}
        given_up = [r["waits_given_up"] for r in rows if "waits_given_up" in r]
        if given_up:
            report[name]["waits_given_up"] = sum(given_up)
        print(f"{name}: {len(rows)} fused stages, {report[name]['wrong']} wrong"
              + (f", {sum(given_up)} waits given up" if given_up else ""), flush=True)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "wave_diff.json"), "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
    return report


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="gpu_wave_diff.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="step", required=True)
    b = sub.add_parser("build", help="here: the wave kernels and their members of each model")
    b.add_argument("--models", required=True, help="comma-separated zoo models")
    b.add_argument("--dir", default=os.path.join(REPO, ".wave_diff"))
    b.add_argument("--target", default="cuda -arch=sm_90")
    b.add_argument("--scheduler", default="greedy")
    b.add_argument("--fusion", choices=("wave", "flow"), default="wave",
                   help="wave: each fused stage's kernel; flow: each flow run's launch (CUDA)")
    r = sub.add_parser("run", help="on the device: each wave kernel against its members")
    r.add_argument("models", nargs="+")
    r.add_argument("--dir", default=os.path.join(REPO, ".wave_diff"))
    r.add_argument("--out", default=os.environ.get("OUT", "wave_diff_out"))
    args = p.parse_args(argv)
    if args.step == "build":
        build([m for m in args.models.split(",") if m], args.dir, args.target, args.scheduler,
              fusion=args.fusion)
        return 0
    report = run(args.models, args.dir, args.out)
    return 1 if any(m["wrong"] for m in report.values()) else 0


if __name__ == "__main__":
    sys.path.insert(0, REPO)
    sys.exit(main())
