"""Learned cost model: stage latency predicted by XGBoost from unit features, trained on measured stages.

Why: IOS wants measured stage costs, but its dynamic program asks for thousands of distinct stages on a large
block (randwire: one 276-unit block) and timing each on a CPU takes tens of milliseconds, so a purely measured
search of such a block runs for hours. This model measures what is cheap and informative — every unit alone
(exact, each distinct kernel once) and a seed set of realistic stages — and predicts every other stage from the
measured latencies of its units. :func:`passes.schedulers.active.active_search` closes the loop: the stages of
each schedule the search picks are measured and added to the training set, the model is refit and the search
rerun, until the chosen schedule has nothing left to measure. A stage that has been measured is always answered
with its measurement, so the final schedule is costed by measurements alone.

What is learned: the *concurrency ratio* ``stage latency / sum of its units' latencies alone``. For a stage of
``k`` groups it lies between about ``max group / sum`` (perfect overlap) and a bit over 1 (contention), which is
a well-scaled target for a few hundred samples; the features (:data:`FEATURES`) describe how the work is spread
over the groups and how big the kernels are. Predictions are clamped to ``>= slowest group alone`` — the bound
the searches prune with (``StageCoster``) — and to ``<= 2x the sum``.

Measurement stays with :class:`~passes.cost.measured.MeasuredCostModel` (its persistent cache included); merge
stages are passed to it unchanged (they need their merged kernel built and are few).
"""
from __future__ import annotations

import logging
import math
import os
import random
import time
from typing import Sequence

import numpy as np

from tvm_interop.runtime.errors import InteropError

from ..graph import OpGraph, Unit
from ..list_scheduling import list_schedule, timeline_to_stages
from . import registry
from .base import CostModel

log = logging.getLogger(__name__)

FEATURES = (
    "groups", "units", "threads_per_group", "log_sum_latency", "log_max_group", "max_over_sum",
    "second_over_max", "min_over_max", "mean_unit_latency_over_max", "log_flops", "log_bytes",
    "max_group_flops_share", "arith_intensity", "longest_group_units",
)


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


def stage_features(groups: Sequence[tuple[float, int, float, float]], cores: int) -> list[float]:
    """Feature vector of one concurrent stage, see :data:`FEATURES`. ``groups``: per group (sum of its units'
    latencies alone, number of units, FLOPs, bytes moved); the order of the groups does not matter."""
    k = len(groups)
    top_g = max(groups)
    lats = sorted((g[0] for g in groups), reverse=True)
    n = sum(g[1] for g in groups)
    total = max(sum(lats), 1e-12)
    top = max(lats[0], 1e-12)
    flops = sum(g[2] for g in groups)
    nbytes = sum(g[3] for g in groups)
    return [
        float(k), float(n), float(max(1, cores // k)), math.log10(total), math.log10(top), top / total,
        lats[1] / top, lats[-1] / top, (total / n) / top,
        math.log10(flops + 1.0), math.log10(nbytes + 1.0),
        (top_g[2] / flops) if flops > 0 else 0.0,
        math.log10((flops + 1.0) / (nbytes + 1.0)),
        float(top_g[1]),
    ]


class LearnedCostModel(CostModel):
    """Predicts concurrent stages with XGBoost; measures units, seed stages and (via ``active_search``) the
    stages of chosen schedules with ``measured`` (a MeasuredCostModel, or any CostModel that times stages).

    ``graph``: the model's OpGraph, used to draw the seed stages (``seed_stages`` of them, plus the multi-group
    stages of list schedules at 2..4 streams). ``trees``/``depth``: the booster's size (small: the training set
    is a few hundred stages). ``seed``: the sampling seed. ``rounds``: how many search-and-measure rounds
    ``passes.search.search_schedule`` runs with this model (``active_search``).
    """

    def __init__(self, measured: CostModel, graph: OpGraph | None = None, seed_stages: int = 48,
                 trees: int = 120, depth: int = 3, seed: int = 0, cores: int | None = None, rounds: int = 4):
        self.measured = measured
        self.rounds = rounds
        self.name = "learned"
        self.cores = cores or _cores()
        self.trees, self.depth, self.seed = trees, depth, seed
        self.seed_stages = seed_stages
        self._samples: dict[tuple, tuple[list[float], float]] = {}  # stage key -> (features, ratio)
        self._known: dict[tuple, float] = {}                          # stage key -> measured seconds
        self._unit: dict[str, float] = {}
        self._predict_memo: dict[tuple, float] = {}
        self._booster = None
        self._fitted_on = 0
        self.predictions = 0
        self.fits = 0
        self.fit_seconds = 0.0
        self.cv_error: float | None = None
        self._graph = graph
        self._seeded = False

    @property
    def device_fingerprint(self) -> str:
        return self.measured.device_fingerprint

    # ------------------------------------------------------------------ measured parts
    def unit_latency(self, unit: Unit) -> float:
        v = self._unit.get(unit.name)
        if v is None:
            v = self._unit[unit.name] = self.measured.unit_latency(unit)
        return v

    @staticmethod
    def _key(groups: Sequence[Sequence[Unit]]) -> tuple:
        return tuple(sorted(tuple(u.name for u in g) for g in groups))

    def is_measured(self, groups: Sequence[Sequence[Unit]], strategy: str = "concurrent") -> bool:
        """True when the stage is costed from measurements only: a merge, one group (its units alone, summed), or
        a measured concurrent stage."""
        groups = [g for g in groups if len(g)]
        if strategy == "merge" or len(groups) <= 1:
            return True
        return self._key(groups) in self._known

    def measure(self, groups: Sequence[Sequence[Unit]]) -> float:
        """Time a concurrent stage (or take it from the measured model's cache) and add it to the training set."""
        groups = [list(g) for g in groups if len(g)]
        key = self._key(groups)
        if key in self._known:
            return self._known[key]
        v = self.measured.stage_latency(groups)
        self._known[key] = v
        feats, total = self._features(groups)
        self._samples[key] = (feats, v / total)
        return v

    def wave_comparison(self, groups: Sequence[Sequence[Unit]], strategy: str = "concurrent") -> dict[str, float]:
        """Wave fusion's choice (``passes.wave.choose``) is a measurement, like every fused stage here: the
        measuring model's paired timing of the fused, scheduled and in-order forms where it has one, else the
        two prices."""
        paired = getattr(self.measured, "wave_comparison", None)
        if callable(paired):
            return paired(groups, strategy)
        return {"wave": self.stage_latency(groups, "wave"), strategy: self.stage_latency(groups, strategy)}

    # ------------------------------------------------------------------ CostModel
    def stage_latency(self, groups: Sequence[Sequence[Unit]], strategy: str = "concurrent") -> float:
        groups = [g for g in groups if len(g)]
        if not groups:
            return 0.0
        if strategy in ("merge", "wave"):   # one kernel (merged / fused): measured, never predicted
            return self.measured.stage_latency(groups, strategy)
        if len(groups) == 1:  # one worker runs the units back to back with all cores: their sum
            return float(sum(self.unit_latency(u) for u in groups[0]))
        key = self._key(groups)
        v = self._known.get(key)
        if v is not None:
            return v
        return self.predict(groups)

    # ------------------------------------------------------------------ fast path for the searches
    def unit_token(self, unit: Unit) -> tuple:
        """What ``StageCoster`` hands back to :meth:`stage_latency_tokens`: (name, latency alone, flops, bytes)."""
        return (unit.name, self.unit_latency(unit), float(unit.flops), float(unit.bytes_moved))

    def stage_latency_tokens(self, groups: Sequence[Sequence[tuple]]) -> float:
        """``stage_latency`` of a concurrent stage given as unit tokens (no Unit objects on the hot path)."""
        if len(groups) == 1:
            return float(sum(t[1] for t in groups[0]))
        v = self._known.get(tuple(sorted(tuple(t[0] for t in g) for g in groups)))
        if v is not None:
            return v
        return self._predict_aggregates([(sum(t[1] for t in g), len(g), sum(t[2] for t in g), sum(t[3] for t in g))
                                         for g in groups])

    # ------------------------------------------------------------------ model
    def _aggregates(self, groups: Sequence[Sequence[Unit]]) -> list[tuple[float, int, float, float]]:
        return [(sum(self.unit_latency(u) for u in g), len(g), float(sum(u.flops for u in g)),
                 float(sum(u.bytes_moved for u in g))) for g in groups]

    def _features(self, groups: Sequence[Sequence[Unit]]) -> tuple[list[float], float]:
        agg = self._aggregates(groups)
        return stage_features(agg, self.cores), max(sum(g[0] for g in agg), 1e-12)

    def predict(self, groups: Sequence[Sequence[Unit]]) -> float:
        """Predicted seconds of a concurrent stage of >= 2 groups (fits the model first if needed)."""
        return self._predict_aggregates(self._aggregates(groups))

    def _predict_aggregates(self, agg: list[tuple[float, int, float, float]]) -> float:
        if self._booster is None or self._fitted_on != len(self._samples):
            self.ensure_seeded()
            self.fit()
        feats = stage_features(agg, self.cores)
        fkey = tuple(feats)
        ratio = self._predict_memo.get(fkey)
        if ratio is None:
            ratio = self._forest.predict_one(np.asarray(feats, dtype=np.float32))
            self._predict_memo[fkey] = ratio
            self.predictions += 1
        total = sum(g[0] for g in agg)
        top = max(g[0] for g in agg)
        return float(min(max(ratio * total, top), 2.0 * total))

    def fit(self) -> None:
        """(Re)train on every measured stage so far; also estimates the held-out error (``cv_error``)."""
        import xgboost as xgb

        if len(self._samples) < 4:
            raise InteropError(f"the learned cost model needs at least 4 measured stages to train, has "
                               f"{len(self._samples)}; the graph has too little concurrency for it")
        t = time.perf_counter()
        X = np.asarray([f for f, _ in self._samples.values()], dtype=np.float32)
        y = np.asarray([r for _, r in self._samples.values()], dtype=np.float32)
        self._booster = self._train(X, y)
        self._forest = TreeEnsemble(self._booster, self.depth)
        self._fitted_on = len(self._samples)
        self._predict_memo.clear()
        self.cv_error = self._cross_validate(X, y, xgb)
        self.fits += 1
        self.fit_seconds += time.perf_counter() - t

    def _train(self, X: np.ndarray, y: np.ndarray):
        import xgboost as xgb

        params = {"max_depth": self.depth, "eta": 0.1, "nthread": 1, "objective": "reg:squarederror",
                  "min_child_weight": 1.0, "subsample": 1.0, "seed": self.seed, "verbosity": 0}
        return xgb.train(params, xgb.DMatrix(X, label=y), self.trees)

    def _cross_validate(self, X: np.ndarray, y: np.ndarray, xgb, folds: int = 4) -> float | None:
        """Median relative error of stage latency on held-out folds (ratio errors = latency errors)."""
        n = len(y)
        if n < 2 * folds:
            return None
        order = np.random.RandomState(self.seed).permutation(n)
        errs = []
        for f in range(folds):
            test = order[f::folds]
            train = np.setdiff1d(order, test)
            b = self._train(X[train], y[train])
            pred = b.inplace_predict(X[test])
            errs.extend(np.abs(pred - y[test]) / np.maximum(y[test], 1e-9))
        return float(np.median(errs))

    # ------------------------------------------------------------------ seed set
    def ensure_seeded(self) -> None:
        if not self._seeded:
            self._seeded = True
            if self._graph is not None:
                self.seed_from(self._graph)

    def seed_from(self, graph: OpGraph) -> int:
        """Measure the seed stages of ``graph``: the multi-group stages of list schedules at 2..4 streams (the
        shapes of stage a search will consider) and ``seed_stages`` random sets of mutually independent units.
        Returns the number of stages measured."""
        before = len(self._samples)
        lat = [self.unit_latency(u) for u in graph.units]
        stages: list[list[list[Unit]]] = []
        for k in (2, 3, 4):
            stream_of, start, finish = list_schedule(graph, lat, k)
            for st in timeline_to_stages(graph, stream_of, start, finish):
                if len(st.groups) > 1:
                    stages.append([[graph.unit(n) for n in g] for g in st.groups])
        stages += self._random_antichains(graph)
        for groups in stages:
            self.measure(groups)
        self._seeded = True
        log.info("learned cost model: %d seed stages measured", len(self._samples) - before)
        return len(self._samples) - before

    def _random_antichains(self, graph: OpGraph) -> list[list[list[Unit]]]:
        n = len(graph.units)
        rng = random.Random(self.seed)
        reach = graph.descendant_masks()
        out, seen, tries = [], set(), 0
        while len(out) < self.seed_stages and tries < 20 * self.seed_stages:
            tries += 1
            k = rng.randint(2, min(6, n))
            picked = [rng.randrange(n)]
            for _ in range(8 * k):
                if len(picked) == k:
                    break
                c = rng.randrange(n)
                if all(c != p and not (reach[p] >> c) & 1 and not (reach[c] >> p) & 1 for p in picked):
                    picked.append(c)
            key = tuple(sorted(picked))
            if len(picked) < 2 or key in seen:
                continue
            seen.add(key)
            out.append([[graph.units[i]] for i in key])
        return out

    # ------------------------------------------------------------------ reporting
    @property
    def measured_stages(self) -> int:
        return len(self._samples)

    def stats(self) -> dict:
        inner = self.measured.stats() if hasattr(self.measured, "stats") else {}
        return dict(inner, learned_measured_stages=self.measured_stages, learned_predictions=self.predictions,
                    learned_fits=self.fits, learned_fit_seconds=round(self.fit_seconds, 3),
                    learned_cv_error=self.cv_error)

    def close(self) -> None:
        if hasattr(self.measured, "close"):
            self.measured.close()


class TreeEnsemble:
    """A trained XGBoost regressor evaluated with numpy, one row at a time, ~10x faster than
    ``Booster.inplace_predict`` (whose fixed per-call cost, ~0.4 ms here, dominates a search that asks for
    hundreds of thousands of single predictions). Each tree is padded to a complete tree of the booster's depth
    (a leaf above the bottom becomes splits that always go left down to copies of its value), so a prediction is
    ``depth`` vectorised steps over all trees. Equal to the booster's own prediction (tested)."""

    def __init__(self, booster, depth: int):
        import json

        model = json.loads(booster.save_raw("json"))
        learner = model["learner"]
        self.base = float(str(learner["learner_model_param"]["base_score"]).strip("[]"))
        trees = learner["gradient_booster"]["model"]["trees"]
        self.depth = depth
        inner, leaves = (1 << depth) - 1, 1 << depth
        t = len(trees)
        self.feat = np.zeros((t, max(inner, 1)), dtype=np.int64)
        self.thr = np.full((t, max(inner, 1)), np.inf, dtype=np.float32)
        self.leaf = np.zeros((t, leaves), dtype=np.float64)
        for ti, tree in enumerate(trees):
            left, right = tree["left_children"], tree["right_children"]
            cond, feat = tree["split_conditions"], tree["split_indices"]

            def fill(node: int, pos: int, level: int) -> None:
                if left[node] == -1:  # a leaf: its value in every bottom slot below pos
                    first = pos
                    for _ in range(depth - level):
                        first = 2 * first + 1
                    span = 1 << (depth - level)
                    self.leaf[ti, first - inner:first - inner + span] = cond[node]
                    return
                if level >= depth:  # pragma: no cover - the booster was trained with max_depth = depth
                    raise InteropError("tree deeper than the booster's max_depth")
                self.feat[ti, pos] = feat[node]
                self.thr[ti, pos] = cond[node]
                fill(left[node], 2 * pos + 1, level + 1)
                fill(right[node], 2 * pos + 2, level + 1)

            fill(0, 0, 0)
        self._rows = np.arange(t)

    def predict_one(self, x: np.ndarray) -> float:
        x = np.asarray(x, dtype=np.float32)
        pos = np.zeros(len(self._rows), dtype=np.int64)
        for _ in range(self.depth):  # xgboost goes left when x < split condition
            right = x[self.feat[self._rows, pos]] >= self.thr[self._rows, pos]
            pos = 2 * pos + 1 + right
        return self.base + float(self.leaf[self._rows, pos - ((1 << self.depth) - 1)].sum())


def _factory(**kwargs) -> CostModel:
    raise InteropError("the learned cost model times kernels: use tvm_interop.compile(..., cost='learned') (it "
                       "builds the kernels it measures), or LearnedCostModel(MeasuredCostModel(program), graph)")


registry.register("learned", _factory)
