"""The open issues' GPU targets, read off one gpu_check result, so a run says at once what it proved.

* issue 12, target 4: ``ios`` measured <= min(sequential, greedy, lios) measured, per model, in both modes, with
  and without CUDA graph (the schedulers' own variants: TVM's kernels and sync, today's wait placement); and the
  geomean speed-up over sequential on inception_v3, randwire, nasnet_a_large and squeezenet >= 1.6x (the best
  scheduled variant against the best sequential one, and ios alone);
* issue 13, target 1: our best sequential program (any entry: TVM kernels, cuDNN units with the legacy or the
  measured engines, auto, split-k, tuned;
  fp32 without TF32) within 1.15x of PyTorch eager + CUDA graph on inception_v3, googlenet, resnet50, squeezenet;
  target 2: our best scheduled variant faster than it on inception_v3, googlenet, nasnet_a_mobile, randwire;
* issue 15: the best wave-fused variant (``+wave``: one launch per wave; ``+flow``: runs of stages in one persistent
  launch) >= 1.2x faster than the best multi-stream variant on randwire and nasnet_a_mobile (with and without
  CUDA graph).

Only variants whose output matched plain TVM count. A model the run did not measure is named, never counted.
"""
from __future__ import annotations

import math

IOS_MODELS_GEOMEAN = ("inception_v3", "randwire", "nasnet_a_large", "squeezenet")
SEQ_MODELS = ("inception_v3", "googlenet", "resnet50", "squeezenet")
BEST_MODELS = ("inception_v3", "googlenet", "nasnet_a_mobile", "randwire")
WAVE_MODELS = ("randwire", "nasnet_a_mobile")
TORCH_GRAPH = "PyTorch eager (cuDNN) + CUDA graph"
PLAIN = ("plain TVM", "PyTorch")
FUSED = ("+wave", "+flow")   # variants whose stages run fused (scripts/gpucheck/common.FUSIONS: "+flow" is in
                             # "+flow_noinline")


def _fused(name: str) -> bool:
    return any(f in name for f in FUSED)


def _ok(v: dict) -> bool:
    return bool(v.get("ok")) and v.get("median_ms") is not None


def _base(name: str) -> str:
    return name.split("+")[0]


def _entries(result: dict) -> dict[str, list[dict]]:
    """Model -> its entries (base first), TF32 entries left out (the targets are fp32 without TF32)."""
    out: dict[str, list[dict]] = {}
    for m in result.get("models", []):
        if "tf32" not in m["name"]:
            out.setdefault(_base(m["name"]), []).append(m)
    return out


def _scheduler_variant(m: dict, sched: str, mode: str, graph: bool) -> dict | None:
    """The scheduler's own variant (TVM's sync, today's waits) of ``mode`` with or without CUDA graph."""
    name = sched + (" (dependency)" if mode == "dependency" else "") + (" + CUDA graph" if graph else "")
    v = next((v for v in m.get("variants", []) if v["name"] == name), None)
    return v if v is not None and _ok(v) else None


def _is_scheduled(name: str) -> bool:
    """A program the product builds (not a baseline, not the old wait placement kept only for comparison)."""
    return not name.startswith(PLAIN) and "[waits at consumer]" not in name


def ios_not_slower(result: dict) -> list[dict]:
    """Per model and (mode, CUDA graph): ios against the fastest of sequential, greedy and lios."""
    rows = []
    for model, entries in _entries(result).items():
        m = entries[0]
        for mode in ("stage", "dependency"):
            for graph in (False, True):
                ios = _scheduler_variant(m, "ios", mode, graph)
                others = {s: _scheduler_variant(m, s, mode, graph) for s in ("sequential", "greedy", "lios")}
                others = {s: v for s, v in others.items() if v is not None}
                if ios is None or not others:
                    continue
                best = min(others, key=lambda s: others[s]["median_ms"])
                ratio = ios["median_ms"] / others[best]["median_ms"]
                rows.append({"model": model, "mode": mode, "cuda_graph": graph, "ios_ms": ios["median_ms"],
                             "best_other": best, "best_other_ms": others[best]["median_ms"], "ratio": ratio,
                             "met": ratio <= 1.0})
    return rows


def _best(variants, pred) -> dict | None:
    cands = [v for v in variants if _ok(v) and pred(v["name"])]
    return min(cands, key=lambda v: v["median_ms"]) if cands else None


def speedups_over_sequential(result: dict) -> dict:
    """Best scheduled variant and best ios variant against the best sequential one (TVM kernels, base entry)."""
    per, missing = {}, []
    entries = _entries(result)
    for model in IOS_MODELS_GEOMEAN:
        if model not in entries:
            missing.append(model)
            continue
        vs = entries[model][0].get("variants", [])
        seq = _best(vs, lambda n: n.startswith("sequential"))
        best = _best(vs, lambda n: _is_scheduled(n) and not n.startswith("sequential"))
        ios = _best(vs, lambda n: n.split(" ")[0] == "ios")
        if seq is None or best is None:
            missing.append(model)
            continue
        per[model] = {"sequential_ms": seq["median_ms"], "best": best["name"],
                      "best_speedup": seq["median_ms"] / best["median_ms"],
                      "ios_speedup": seq["median_ms"] / ios["median_ms"] if ios else None}

    def geo(key):
        xs = [r[key] for r in per.values() if r[key]]
        if missing or not xs or len(xs) != len(per):
            return None   # a geomean over fewer models than the target names is not the target's
        return math.exp(sum(map(math.log, xs)) / len(xs))

    return {"models": per, "missing": missing, "geomean_best": geo("best_speedup"), "geomean_ios": geo("ios_speedup")}


def _with_engine_variants(m: dict) -> list[dict]:
    """An entry's variants and those its engines pass re-timed under the other cuDNN engine policy (a runtime
    policy of the same library: ``TVM_INTEROP_CUDNN_ENGINES=legacy|measured``)."""
    return [*m.get("variants", []), *(m.get("cudnn_engines") or {}).get("variants", [])]


def against_pytorch(result: dict) -> dict:
    """Our best sequential (target 1) and best scheduled (target 2) program of any entry against PyTorch eager +
    CUDA graph."""
    entries = _entries(result)
    out = {"sequential": {}, "best": {}, "missing": []}
    for models, key, pred, limit in ((SEQ_MODELS, "sequential", lambda n: n.startswith("sequential"), 1.15),
                                     (BEST_MODELS, "best", _is_scheduled, 1.0)):
        for model in models:
            torch = next((v for m in entries.get(model, []) for v in m.get("variants", [])
                          if v["name"] == TORCH_GRAPH and v.get("median_ms")), None)
            ours = [(m["name"], v) for m in entries.get(model, []) for v in _with_engine_variants(m)
                    if _ok(v) and pred(v["name"])]
            if torch is None or not ours:
                out["missing"].append(f"{model} ({key})")
                continue
            entry, v = min(ours, key=lambda x: x[1]["median_ms"])
            ratio = v["median_ms"] / torch["median_ms"]
            out[key][model] = {"entry": entry, "variant": v["name"], "ms": v["median_ms"],
                               "pytorch_ms": torch["median_ms"], "ratio": ratio,
                               "met": ratio <= limit if key == "sequential" else ratio < limit}
    return out


def wave_over_streams(result: dict) -> dict:
    """Per model, with and without CUDA graph: the best wave-fused variant against the best multi-stream one."""
    out = {}
    for model in WAVE_MODELS:
        entries = _entries(result).get(model)
        if not entries:
            continue
        vs = entries[0].get("variants", [])
        for graph in (False, True):
            def same(n: str) -> bool:
                return ("+ CUDA graph" in n) == graph

            wave = _best(vs, lambda n: _fused(n) and same(n))
            streams = _best(vs, lambda n: _is_scheduled(n) and not _fused(n) and not n.startswith("sequential")
                            and same(n))
            if streams and not wave and any(_fused(v["name"]) and same(v["name"]) for v in vs):
                out[f"{model}{' + CUDA graph' if graph else ''}"] = {"wrong": True}
            if wave and streams:
                r = streams["median_ms"] / wave["median_ms"]
                out[f"{model}{' + CUDA graph' if graph else ''}"] = {
                    "wave": wave["name"], "wave_ms": wave["median_ms"], "streams": streams["name"],
                    "streams_ms": streams["median_ms"], "speedup": r, "met": r >= 1.2}
    return out


def render_targets(result: dict) -> list[str]:
    """The targets section of the report."""
    lines = ["## The issues' GPU targets (this run)", ""]
    rows = ios_not_slower(result)
    if rows:
        met = sum(r["met"] for r in rows)
        lines += [f"Issue 12, target 4: ios <= min(sequential, greedy, lios) in {met} of {len(rows)} (model, mode, "
                  "CUDA graph) cells:", "", "| model | mode | CUDA graph | ios ms | fastest other | ios / it |",
                  "|---|---|---|---:|---|---:|"]
        lines += [f"| {r['model']} | {r['mode']} | {'yes' if r['cuda_graph'] else 'no'} | {r['ios_ms']:.3f} | "
                  f"{r['best_other']} {r['best_other_ms']:.3f} | {r['ratio']:.2f}{'' if r['met'] else ' (not met)'} |"
                  for r in rows]
        lines.append("")
    sp = speedups_over_sequential(result)
    if sp["models"]:
        per = "; ".join(f"{m} {r['best_speedup']:.2f}x ({r['best']})"
                        + (f", ios {r['ios_speedup']:.2f}x" if r["ios_speedup"] else "") for m, r in sp["models"].items())
        g = sp["geomean_best"]
        lines += [f"Speed-up of the best scheduled variant over the best sequential one: {per}."
                  + (f" Geomean {g:.2f}x (target 1.6x: {'met' if g >= 1.6 else 'not met'}; ios alone "
                     f"{sp['geomean_ios']:.2f}x)." if g else "")
                  + (f" Not in this run: {', '.join(sp['missing'])} (no geomean)." if sp["missing"] else ""), ""]
    pt = against_pytorch(result)
    for key, what in (("sequential", "Issue 13, target 1: our best sequential program within 1.15x of PyTorch eager "
                                     "+ CUDA graph"),
                      ("best", "Issue 13, target 2: our best scheduled variant faster than PyTorch eager + CUDA "
                               "graph")):
        if pt[key]:
            lines.append(f"{what}: " + "; ".join(
                f"{m} {r['ratio']:.2f}x ({r['entry']}: {r['variant']}, {r['ms']:.3f} vs {r['pytorch_ms']:.3f} ms"
                f"{'' if r['met'] else ', not met'})" for m, r in pt[key].items()) + ".")
    if pt["missing"]:
        lines.append(f"Not in this run (no PyTorch baseline or no variant): {', '.join(pt['missing'])}.")
    wv = wave_over_streams(result)
    if wv:
        lines += ["", "Issue 15: the best wave- or flow-fused variant against the best multi-stream variant (target 1.2x): "
                  + "; ".join(f"{k}: no wave-fused variant computed plain TVM's output" if r.get("wrong") else
                              f"{k} {r['speedup']:.2f}x ({r['wave']} {r['wave_ms']:.3f} vs {r['streams']} "
                              f"{r['streams_ms']:.3f} ms{'' if r['met'] else ', not met'})" for k, r in wv.items())
                  + "."]
    return lines + [""]
