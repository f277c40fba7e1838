"""MetaSchedule tuning of a prepared program's kernels into a persistent, resumable database.

The units the scheduler places are the PrimFuncs of the prepared (legalized + fused) module. Tuning them makes
every later step (the measured cost model, the schedulers' choices, the final build) work with the kernels that
will really ship:

``tune_program(program, target, work_dir, trials)``
    extracts the unique PrimFuncs (MetaSchedule's task extraction: structurally equal functions are one task,
    their call count its weight) and tunes each with MetaSchedule (evolutionary search, XGBoost cost model) into
    the JSON database in ``work_dir`` (``database_workload.json``, ``database_tuning_record.json``: MetaSchedule's
    own format, usable with ``relax.transform.MetaScheduleApplyDatabase`` directly). ``trials`` is per task.

    Resumable: the trials of a task are counted from the database, so a second call with the same ``trials`` tunes
    nothing and a call with more trials continues where the last one stopped (the search starts from the best
    records in the database; the cost model's training data is kept in ``cost_model.tar``). A task whose search
    space ran out before ``trials`` is remembered as exhausted and not retried for the same budget.

    Interruptible: MetaSchedule appends one JSON line per measured candidate after each batch; Ctrl-C between or
    inside a batch leaves whole lines (a torn last line, should one appear, is dropped when the database is next
    opened), the state file is replaced atomically, and the next call continues.

``apply_database(mod, target, work_dir)``
    the module with every PrimFunc found in the database replaced by its best tuned version (names, attributes
    and the Relax ``main`` unchanged; functions without a record unchanged; where the default CPU schedule of
    ``prepare`` measured faster than the best record, the default is kept). ``tvm_interop.compile(...,
    tuning_db=DIR)`` does this right after prepare, so measured costs and the build use the same kernels.

Tasks and database keys are the *unscheduled* kernels (``prepare`` keeps them in the module attribute
``tvm_interop.cpu_scheduled`` when it applies default CPU schedules), so a database stays valid when the default
schedules change. With MetaSchedule's XGBoost model the first 100 candidates of a task are chosen at random (its
``num_warmup_samples``): on this 2-core CPU, 16-64 trials rarely beat ``cpu_schedule``, ~200 do.

Builds and runs happen in this process (``passes.kernels.fast_builder``): a trial costs about a second for a small
convolution instead of the minute the stock ``LocalBuilder`` pays per batch here. Besides MetaSchedule's files,
``work_dir`` holds ``tvm_interop_tuning.json`` (target, device, per-task baselines and status), ``cost_model.tar``
and ``logs/``.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field

import numpy as np
import tvm
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.cost_model.xgb_model import XGBModel
from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback

from tvm_interop.runtime import atomic
from tvm_interop.runtime.errors import InteropError

from .fast_builder import BuildStats, InProcessBuilder, InProcessRunner, TimedBuilder, TimedRunner, \
    build_candidate, measure_module, tensor_intrinsics_for

log = logging.getLogger(__name__)

__all__ = ["tune_program", "apply_database", "tuned_functions", "TuningReport", "TaskReport", "TuningError",
           "database_summary", "tuning_target"]

STATE_FILE = "tvm_interop_tuning.json"
STATE_FORMAT = "tvm-interop-tuning"
STATE_VERSION = 1
COST_MODEL_FILE = "cost_model.tar"
WORKLOAD_FILE = "database_workload.json"
RECORD_FILE = "database_tuning_record.json"
TUNED_ATTR = "tvm_interop.tuned"
_FAILED = 1e9  # MetaSchedule stores 1e10 s for candidates that failed to build or run


class TuningError(InteropError):
    """A tuning database cannot be used (missing, for another kind of target, locked by another tuner)."""


# ----------------------------------------------------------------------------------------------- reports
@dataclass
class TaskReport:
    """One tuning task: a unique PrimFunc (``weight`` = how many calls of the program use it)."""

    name: str
    weight: int
    flops: float
    trials: int = 0  # records in the database for this workload (honest: failed candidates count)
    new_trials: int = 0  # measured by this call
    best_ms: float | None = None  # best tuned latency
    untuned_ms: float | None = None  # TVM's default build of the unscheduled PrimFunc
    default_ms: float | None = None  # passes.kernels.cpu_schedule's schedule (None: not available)
    status: str = "pending"  # tuned | done (nothing to do) | exhausted | interrupted | failed | pending
    seconds: float = 0.0  # tuning wall time in this call
    error: str | None = None

    @property
    def speedup(self) -> float | None:
        """Untuned latency / best tuned latency."""
        base = self.untuned_ms
        return base / self.best_ms if base and self.best_ms else None

    @property
    def uses(self) -> str:
        """What ``apply_database`` (``prefer_faster``) puts in a prepared module: ``tuned`` or ``default``."""
        if self.best_ms is None:
            return "default"
        return "default" if self.default_ms is not None and self.best_ms >= self.default_ms else "tuned"

    @property
    def applied_ms(self) -> float | None:
        """Latency of the version ``apply_database`` chooses."""
        return self.best_ms if self.uses == "tuned" else (self.default_ms if self.default_ms is not None
                                                          else self.untuned_ms)


@dataclass
class TuningReport:
    work_dir: str
    target: str
    trials_per_task: int
    tasks: list[TaskReport] = field(default_factory=list)
    seconds: float = 0.0
    interrupted: bool = False
    stats: dict = field(default_factory=dict)  # builder/runner counters of this call

    @property
    def new_trials(self) -> int:
        return sum(t.new_trials for t in self.tasks)

    def weighted_ms(self, which: str) -> float | None:
        """Sum over tasks of weight x latency (``untuned``, ``default`` or ``best``; tuned falls back to the
        untuned latency for tasks without a valid record)."""
        total = 0.0
        for t in self.tasks:
            v = t.applied_ms if which == "applied" else getattr(t, f"{which}_ms")
            if which == "best" and v is None:
                v = t.untuned_ms
            if v is None:
                return None
            total += t.weight * v
        return total

    def to_dict(self) -> dict:
        return {"work_dir": self.work_dir, "target": self.target, "trials_per_task": self.trials_per_task,
                "seconds": self.seconds, "interrupted": self.interrupted, "new_trials": self.new_trials,
                "seconds_per_trial": self.seconds / self.new_trials if self.new_trials else None,
                "weighted_untuned_ms": self.weighted_ms("untuned"), "weighted_default_ms": self.weighted_ms("default"),
                "weighted_tuned_ms": self.weighted_ms("best"), "weighted_applied_ms": self.weighted_ms("applied"),
                "stats": self.stats,
                "tasks": [{**asdict(t), "speedup": t.speedup, "uses": t.uses} for t in self.tasks]}

    def table(self) -> str:
        def us_(v):  # ms -> us text
            return "-" if v is None else f"{v * 1e3:.1f}"

        def ms_(v):
            return "-" if v is None else f"{v:.3f}"

        rows = [f"{'task':40s} {'calls':>5s} {'MFLOP':>8s} {'trials':>6s} {'untuned us':>10s} {'default us':>10s} "
                f"{'tuned us':>9s} {'speedup':>7s} {'uses':>7s}  status"]
        for t in self.tasks:
            sp = "-" if t.speedup is None else f"{t.speedup:.1f}x"
            rows.append(f"{t.name[:40]:40s} {t.weight:5d} {t.flops / 1e6:8.1f} {t.trials:6d} {us_(t.untuned_ms):>10s} "
                        f"{us_(t.default_ms):>10s} {us_(t.best_ms):>9s} {sp:>7s} {t.uses:>7s}  {t.status}")
        wu, wd, wb = self.weighted_ms("untuned"), self.weighted_ms("default"), self.weighted_ms("best")
        rows.append(f"sum of calls x latency: untuned {ms_(wu)} ms, default schedule {ms_(wd)} ms, best tuned "
                    f"{ms_(wb)} ms, with the database {ms_(self.weighted_ms('applied'))} ms")
        per = f", {self.seconds / self.new_trials:.2f} s per trial" if self.new_trials else ""
        rows.append(f"{self.new_trials} new trials in {self.seconds:.1f} s{per}"
                    + ("  (interrupted)" if self.interrupted else ""))
        return "\n".join(rows)


# ----------------------------------------------------------------------------------------------- helpers
def _cpu_fingerprint() -> str:
    from ..cost.measured import cpu_fingerprint

    return cpu_fingerprint()


def tuning_target(target, num_cores: int | None = None) -> tvm.target.Target:
    """The target MetaSchedule tunes for: ``target`` normalised, a CPU target with ``num-cores`` set (MetaSchedule
    needs it; default: the physical cores of this machine)."""
    from ..target import normalize_target

    t = normalize_target(target)
    if t.kind.name in ("llvm", "c") and not t.attrs.get("num-cores"):
        d = {k: v for k, v in dict(t.export()).items() if v not in (None, "", [])}
        d["num-cores"] = int(num_cores or ms.utils.cpu_count(logical=False))
        t = tvm.target.Target(d)
    return t


def _target_text(target: tvm.target.Target) -> str:
    """The target as a JSON object text (sorted keys; arrays as lists), for the state file."""
    def plain(v):
        if isinstance(v, (str, int, float, bool)) or v is None:
            return v
        if isinstance(v, dict) or hasattr(v, "items"):
            return {str(k): plain(x) for k, x in v.items()}
        try:
            return [plain(x) for x in v]
        except TypeError:
            return str(v)

    d = {k: plain(v) for k, v in dict(target.export()).items() if v not in (None, "")}
    d = {k: v for k, v in d.items() if v != []}
    return json.dumps(d, sort_keys=True)


def _repair_jsonl(path: str) -> int:
    """Drop lines of a MetaSchedule JSON-lines table that do not parse (a torn last line). Returns lines dropped."""
    if not os.path.exists(path):
        return 0
    with open(path, "rb") as f:
        data = f.read()
    lines = data.split(b"\n")
    good, bad = [], 0
    for ln in lines:
        if not ln.strip():
            continue
        try:
            json.loads(ln)
            good.append(ln)
        except ValueError:
            bad += 1
    if bad:
        log.warning("tuning database %s: dropped %d unreadable line(s) (an interrupted write)", path, bad)
        _atomic_write(path, b"".join(ln + b"\n" for ln in good))
    return bad


def _atomic_write(path: str, data: bytes) -> None:
    atomic.write_bytes(path, data, fsync=True)


def _has_database(work_dir: str) -> bool:
    return os.path.exists(os.path.join(work_dir, WORKLOAD_FILE))


def _open_database(work_dir: str, create: bool) -> ms.database.JSONDatabase:
    if not create and not _has_database(work_dir):
        raise TuningError(f"no tuning database in {work_dir!r} (expected {WORKLOAD_FILE}); "
                          "run `tvm-interop tune MODEL --db DIR` first")
    os.makedirs(work_dir, exist_ok=True)
    _repair_jsonl(os.path.join(work_dir, WORKLOAD_FILE))
    _repair_jsonl(os.path.join(work_dir, RECORD_FILE))
    return ms.database.JSONDatabase(work_dir=work_dir, module_equality="structural")


def _read_state(work_dir: str) -> dict | None:
    path = os.path.join(work_dir, STATE_FILE)
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            state = json.load(f)
        if state.get("format") != STATE_FORMAT:
            raise ValueError("not a tvm-interop tuning state file")
        return state
    except (OSError, ValueError) as err:
        log.warning("%s unreadable (%s); starting a fresh state (the database itself is kept)", path, err)
        return None


def _write_state(work_dir: str, state: dict) -> None:
    _atomic_write(os.path.join(work_dir, STATE_FILE), json.dumps(state, indent=1, sort_keys=True).encode())


def _check_target(state: dict | None, target: tvm.target.Target, work_dir: str, strict_device: bool,
                  here: str | None = None) -> None:
    """Refuse a database tuned for another kind of target; warn (or refuse) when tuned on another machine
    (``here``: the measuring device's fingerprint, default this machine's)."""
    if not state:
        return
    theirs = json.loads(state.get("target", "{}"))
    if theirs.get("kind") and theirs["kind"] != target.kind.name:
        raise TuningError(f"the tuning database in {work_dir!r} was tuned for target kind {theirs['kind']!r}, "
                          f"not {target.kind.name!r}; use another --db directory")
    if here is None:
        here = _cpu_fingerprint() if target.kind.name in ("llvm", "c") else target.kind.name
    if state.get("device") and state["device"] != here:
        msg = (f"the tuning database in {work_dir!r} was tuned on {state['device']!r}, this is {here!r}: its kernels "
               "are correct here but may not be the fastest")
        if strict_device:
            raise TuningError(msg)
        log.warning(msg)


@contextlib.contextmanager
def _lock(work_dir: str):
    """One tuner per database directory at a time."""
    import fcntl

    path = os.path.join(work_dir, ".lock")
    with open(path, "a+") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise TuningError(f"the tuning database {work_dir!r} is being tuned by another process") from None
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _as_module(program_or_mod, target) -> tvm.IRModule:
    mod = getattr(program_or_mod, "mod", program_or_mod)
    if not isinstance(mod, tvm.IRModule):
        raise TuningError(f"expected a Program or an IRModule, got {type(program_or_mod).__name__}")
    if not any(isinstance(f, tvm.tirx.PrimFunc) for f in mod.functions.values()):
        from ..prepare import prepare  # a plain Relax model: legalize + fuse first, as compile does

        mod = prepare(mod, target)
    return mod


def _tuning_source(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with each PrimFunc replaced by its unscheduled original where ``prepare`` kept one (CPU targets get
    ``cpu_schedule``'s default schedules, the originals are in the module attribute ``tvm_interop.cpu_scheduled``).

    Tasks and database keys are the unscheduled kernels, as TVM's fusion produced them: MetaSchedule tunes from
    those, and a database stays valid whatever default schedule the prepared module carries.
    """
    from .. import prepare as _prepare

    key = getattr(_prepare, "CPU_SCHEDULED", None)
    original = mod.attrs[key] if key and mod.attrs is not None and key in mod.attrs else None
    names = {gv.name_hint for gv in original.get_global_vars()} if original is not None else set()
    funcs = {}
    for gv, func in mod.functions.items():
        if isinstance(func, tvm.tirx.PrimFunc) and gv.name_hint in names:
            funcs[gv] = original[gv.name_hint]
        else:
            funcs[gv] = func
    return tvm.IRModule(funcs)


def _extract_tasks(mod: tvm.IRModule, target, op_names: list[str] | None):
    """(the module tuned, its MetaSchedule tasks): unscheduled kernels only, those whose name contains one of
    ``op_names`` when given."""
    src = _tuning_source(mod)
    extracted = ms.relax_integration.extract_tasks(src, target, module_equality="structural")
    extracted = [t for t in extracted if not _is_scheduled(t.dispatched[0]["main"])]
    if op_names:
        extracted = [t for t in extracted if any(o in t.task_name for o in op_names)]
    return src, extracted


def _is_scheduled(func) -> bool:
    return func.attrs is not None and "tirx.is_scheduled" in func.attrs


def _record_seconds(rec) -> float | None:
    secs = [float(s) for s in (rec.run_secs or [])]
    if not secs:
        return None
    v = float(np.mean(secs))
    return None if v >= _FAILED else v


class _Records:
    """The database's records grouped by workload (read once per query; JSONDatabase keeps them in memory)."""

    def __init__(self, db):
        self.db = db

    def for_task(self, mod: tvm.IRModule) -> tuple[int, float | None]:
        """(records, best seconds) for a task's module."""
        if not self.db.has_workload(mod):
            return 0, None
        wkl = self.db.commit_workload(mod)
        n = sum(1 for r in self.db.get_all_tuning_records() if r.workload.same_as(wkl))
        top = self.db.get_top_k(wkl, 1)
        return n, (_record_seconds(top[0]) if top else None)


# ----------------------------------------------------------------------------------------------- cost model
@derived_object
class WarmupXGBModel(XGBModel._cls):
    """MetaSchedule's XGBoost cost model, minus its wasted work before warm-up.

    ``XGBModel.predict`` returns random scores until ``num_warmup_samples`` (100) candidates are measured, yet
    ``update`` retrains the booster after every batch (tens of seconds on a busy 2-core machine). This subclass
    skips training until then (same predictions), and loads a saved model that has data but no booster yet.
    """

    def _train(self, xs, ys):  # noqa: D401
        if self.data_size < self.num_warmup_samples:
            self.last_train_size = 0  # train as soon as there is enough data
            return
        super()._train(xs, ys)

    def load(self, path: str) -> None:
        from collections import OrderedDict

        from tvm.s_tir.meta_schedule.cost_model.xgb_model import FeatureGroup
        from tvm.support.tar import untar

        with tempfile.TemporaryDirectory() as tmp_dir:
            untar(path, tmp_dir)
            data, size = OrderedDict(), 0
            for group_hash, features, costs in np.load(os.path.join(tmp_dir, "data.npy"), allow_pickle=True):
                data[group_hash] = FeatureGroup(group_hash=group_hash, features=list(features), costs=costs)
                size += len(costs)
            booster = None
            model_path = os.path.join(tmp_dir, "model.bin")
            if os.path.exists(model_path):
                import xgboost as xgb

                booster = xgb.Booster()
                booster.load_model(model_path)
        self.data, self.data_size, self.booster = data, size, booster
        self.last_train_size = size if booster is not None else 0


def _make_cost_model(kind, work_dir: str, num_threads: int):
    if not isinstance(kind, str):
        return kind, False
    if kind == "xgb":
        model = WarmupXGBModel(num_tuning_cores=num_threads)
        path = os.path.join(work_dir, COST_MODEL_FILE)
        if os.path.exists(path):
            try:
                model.load(path)
                log.info("cost model: %d measured candidates loaded from %s", model.data_size, path)
            except Exception as err:  # noqa: BLE001 - a broken cost model file is only lost training data
                log.warning("cost model %s unreadable (%s); starting a fresh one", path, err)
                model = WarmupXGBModel(num_tuning_cores=num_threads)
        return model, True
    if kind == "random":
        return ms.cost_model.RandomModel(), False
    raise TuningError(f"unknown cost model {kind!r} (xgb, random, or a MetaSchedule CostModel)")


def _save_cost_model(model, work_dir: str) -> None:
    if getattr(model, "data_size", 0) <= 0:
        return
    path = os.path.join(work_dir, COST_MODEL_FILE)
    try:
        with atomic.atomic_path(path) as tmp:
            model.save(tmp)
    except Exception as err:  # noqa: BLE001
        log.warning("could not save the cost model to %s: %s", path, err)


# ----------------------------------------------------------------------------------------------- progress
class _Printer:
    """One line per task on stderr; updated in place on a terminal."""

    def __init__(self, enabled: bool, stream=None):
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = enabled and self.stream.isatty()
        self._open = False

    def line(self, text: str, final: bool) -> None:
        if not self.enabled:
            return
        if self.tty:
            self.stream.write("\r\x1b[2K" + text + ("\n" if final else ""))
            self._open = not final
        elif final:
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self._open:
            self.stream.write("\n")
            self.stream.flush()
            self._open = False


def _ms(v):
    return "-" if v is None else f"{v * 1e3:.3f} ms"


@derived_object
class _ProgressCallback(PyMeasureCallback):
    """Counts this task's measured candidates and the best latency after every batch."""

    def __init__(self, report: TaskReport, prefix: str, printer: _Printer, target_trials: int):
        super().__init__()
        self.report, self.prefix, self.printer, self.target_trials = report, prefix, printer, target_trials
        self.best = None if report.best_ms is None else report.best_ms / 1e3
        self.t0 = time.perf_counter()

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results) -> None:
        for res in runner_results:
            self.report.new_trials += 1
            secs = [float(s) for s in (res.run_secs or [])]
            if res.error_msg is None and secs:
                v = float(np.mean(secs))
                if v < _FAILED and (self.best is None or v < self.best):
                    self.best = v
        self.report.best_ms = None if self.best is None else self.best * 1e3
        done = self.report.trials + self.report.new_trials
        el = time.perf_counter() - self.t0
        self.printer.line(f"{self.prefix} {done}/{self.target_trials} trials, best {_ms(self.best)} "
                          f"(untuned {_ms(None if self.report.untuned_ms is None else self.report.untuned_ms / 1e3)}),"
                          f" {el:.0f} s", final=False)


# ----------------------------------------------------------------------------------------------- baselines
def _task_key(func) -> str:
    """Key of a PrimFunc's tuning task: MetaSchedule's task module for it, hashed as the database does."""
    return ms.utils.shash2hex(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}))


def _default_version(mod: tvm.IRModule, src: tvm.IRModule, key: str, target):
    """The kernel that ships without tuning for the task ``key``: the prepared module's function (with its default
    CPU schedule) when ``prepare`` applied one, else ``cpu_schedule``'s schedule of it (informative); None when
    there is no default schedule for this target."""
    from .. import prepare as _prepare

    attr = getattr(_prepare, "CPU_SCHEDULED", None)
    applied = attr is not None and mod.attrs is not None and attr in mod.attrs
    for gv, func in src.functions.items():
        if isinstance(func, tvm.tirx.PrimFunc) and not _is_scheduled(func) and _task_key(func) == key:
            if applied:
                return mod[gv]
            if target.kind.name != "llvm":
                return None
            try:
                from .cpu_schedule import schedule_cpu
            except ImportError:
                return None
            return schedule_cpu(func, target)
    return None


def _baseline_ms(func, target, device_type: str, timer=None) -> float | None:
    """Latency of one kernel version, measured like a tuning candidate (here, or by ``timer(module, args_info)``:
    a fleet runner's)."""
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    if func is None:
        return None
    try:
        mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
        rt = build_candidate(mod, target)
        # the build drops a weight-repack block (cpu_schedule marks it as MetaSchedule layout-rewrite
        # preprocessing; a built library repacks once, passes.kernels.prepack): the kernel then takes the
        # repacked weight, as a tuned candidate with a layout rewrite does
        args_info = ArgInfo.from_entry_func(mod, remove_preproc=True)
        secs = timer(rt, args_info, target) if timer else measure_module(rt, args_info, device_type)
        return float(np.mean(secs)) * 1e3
    except Exception as err:  # noqa: BLE001 - a baseline is informative only
        log.warning("baseline measurement failed: %s", err)
        return None


# ----------------------------------------------------------------------------------------------- tune
def _search_strategy(batch: int, population_size: int | None):
    pop = population_size or int(min(512, max(64, 8 * batch)))
    return ms.search_strategy.EvolutionarySearch(population_size=pop, init_min_unmeasured=min(50, pop),
                                                 genetic_num_iters=4 if pop >= 256 else 2)


def _task_logger(work_dir: str, name: str) -> logging.Logger:
    lg = logging.getLogger(f"tvm_interop.tuning.task.{name}")
    lg.setLevel(logging.DEBUG)
    lg.propagate = False
    path = os.path.abspath(os.path.join(work_dir, "logs", f"{name}.log"))
    if not any(getattr(h, "baseFilename", None) == path for h in lg.handlers):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        for h in list(lg.handlers):
            lg.removeHandler(h)
            h.close()
        h = logging.FileHandler(path, mode="a")
        h.setFormatter(logging.Formatter("%(asctime)s [%(levelname)s] %(message)s"))
        lg.addHandler(h)
    return lg


def _close_task_logger(name: str) -> None:
    lg = logging.getLogger(f"tvm_interop.tuning.task.{name}")
    for h in list(lg.handlers):
        lg.removeHandler(h)
        h.close()


class _InterruptWatch:
    """Notes a Ctrl-C (SIGINT) during tuning. A KeyboardInterrupt raised inside a Python callback of MetaSchedule's
    C++ task scheduler comes back out of ``tune_tasks`` as a plain RuntimeError, so the exception type alone
    cannot tell an interrupt from a failed task."""

    def __init__(self):
        self.hit = False
        self._prev = None

    def __enter__(self):
        import signal
        import threading

        if threading.current_thread() is threading.main_thread():
            self._prev = signal.getsignal(signal.SIGINT)
            signal.signal(signal.SIGINT, self._handler)
        return self

    def _handler(self, signum, frame):
        self.hit = True
        raise KeyboardInterrupt

    def __exit__(self, *exc):
        import signal

        if self._prev is not None:
            signal.signal(signal.SIGINT, self._prev)
        return False

    def is_interrupt(self, err: BaseException) -> bool:
        return self.hit or isinstance(err, KeyboardInterrupt) or "KeyboardInterrupt" in repr(err)


def tune_program(program, target="llvm", work_dir: str = "tuning_db", trials: int = 64, *,
                 op_names: list[str] | None = None, num_trials_per_iter: int = 64, cost_model="xgb",
                 builder="inprocess", runner="inprocess", builder_workers: int = 1, num_threads: int | None = None,
                 population_size: int | None = None, seed: int | None = None, baselines: bool = True,
                 quiet: bool = False, progress: bool | None = None, strict_device: bool = False,
                 fleet=None) -> TuningReport:
    """Tune the unique PrimFuncs of ``program`` (a ``passes.extract.Program``, a prepared module, or a Relax module,
    which is prepared first) with MetaSchedule into the JSON database in ``work_dir``; ``trials`` per task.

    ``op_names``: tune only tasks whose name contains one of these strings (e.g. ``["conv2d"]``).
    ``num_trials_per_iter``: candidates per batch (builder/runner round, cost-model update).
    ``cost_model``: ``"xgb"`` (MetaSchedule's XGBoost model, kept in ``work_dir``), ``"random"``, or a CostModel.
    ``builder`` / ``runner``: ``"inprocess"`` (``passes.kernels.fast_builder``) or ``"local"`` (MetaSchedule's
    process pools: slow here, needs ``cloudpickle``; for comparison) or MetaSchedule objects.
    ``num_threads``: threads of the search and ``num-cores`` of a CPU target (default: physical cores).
    ``population_size``: evolutionary search population (default: 8 x batch, between 64 and MetaSchedule's 512).
    ``baselines``: also time each task's untuned kernel (TVM's default build, and ``cpu_schedule``'s), once per
    database. ``quiet`` / ``progress``: progress lines on stderr (default: only on a terminal).
    ``fleet``: a ``passes.fleet.Fleet``: candidates and baselines are timed on its devices (``runner`` is then a
    ``FleetRunner``), the database is keyed by the devices' fingerprint, and a CPU target's ``num-cores`` is the
    devices' core count.

    Returns a :class:`TuningReport`. On Ctrl-C the database and state are left consistent and KeyboardInterrupt is
    re-raised (the report so far is on ``KeyboardInterrupt.args[1]``).
    """
    t_start = time.perf_counter()
    if trials < 0:
        raise TuningError("trials must be >= 0")
    num_threads = int(num_threads or ms.utils.cpu_count(logical=False))
    device_print = None
    if fleet is not None:
        from ..fleet.runner import FleetRunner
        from ..target import normalize_target

        fleet.start()
        device_print = fleet.fingerprint
        kind = fleet.devices[0].info.get("device_kind")
        wanted = "cpu" if normalize_target(target).kind.name in ("llvm", "c") else normalize_target(target).kind.name
        if kind != wanted:
            raise TuningError(f"target {target!r} runs on {wanted!r}, but the devices under key {fleet.key!r} "
                              f"are {kind!r} ({fleet.fingerprint})")
        runner = FleetRunner(fleet)
        target = tuning_target(target, fleet.devices[0].info.get("cores") or num_threads)
    target = tuning_target(target, num_threads)
    mod = _as_module(program, target)
    os.makedirs(work_dir, exist_ok=True)
    device_type = "cpu" if target.kind.name in ("llvm", "c") else target.kind.name
    printer = _Printer(enabled=(not quiet) if progress is None else bool(progress))
    if progress is None and not printer.tty:
        printer.enabled = False
    report = TuningReport(work_dir=os.path.abspath(work_dir), target=_target_text(target), trials_per_task=trials)
    stats = BuildStats()
    with _lock(work_dir):
        state = _read_state(work_dir)
        here = device_print or (_cpu_fingerprint() if device_type == "cpu" else target.kind.name)
        _check_target(state, target, work_dir, strict_device, here)
        if state is None:
            state = {"format": STATE_FORMAT, "version": STATE_VERSION, "tasks": {}}
        state.update(target=_target_text(target), tvm_version=tvm.__version__, device=here)
        db = _open_database(work_dir, create=True)
        records = _Records(db)
        src, extracted = _extract_tasks(mod, target, op_names)
        from ..extract import prim_func_flops

        reports: list[tuple] = []
        for t in extracted:
            tmod = t.dispatched[0]
            key = ms.utils.shash2hex(tmod)
            n, best = records.for_task(tmod)
            st = state["tasks"].setdefault(key, {})
            st.setdefault("name", t.task_name)
            rep = TaskReport(name=t.task_name, weight=int(t.weight), flops=prim_func_flops(tmod["main"]),
                             trials=n, best_ms=None if best is None else best * 1e3)
            reports.append((t, tmod, key, rep))
            report.tasks.append(rep)
        # untuned baselines, once per database (they take a build and a run each)
        if baselines:
            todo = sum(1 for *_, key, _r in reports if "untuned_ms" not in state["tasks"][key])
            if todo:
                printer.line(f"timing {todo} untuned kernel(s) ...", final=False)
            for t, tmod, key, rep in reports:
                st = state["tasks"][key]
                timer = runner.time_module if fleet is not None else None
                if "untuned_ms" not in st:
                    st["untuned_ms"] = _baseline_ms(tmod["main"], target, device_type, timer)
                if "default_ms" not in st:
                    st["default_ms"] = _baseline_ms(_default_version(mod, src, key, target), target, device_type,
                                                    timer)
        for t, tmod, key, rep in reports:
            st = state["tasks"][key]
            rep.untuned_ms, rep.default_ms = st.get("untuned_ms"), st.get("default_ms")
        _write_state(work_dir, state)

        model, persistent_model = _make_cost_model(cost_model, work_dir, num_threads)
        scratch = tempfile.mkdtemp(prefix="tvm_interop_tune_")  # candidates' artifacts; removed at the end
        builder, runner = _make_builder_runner(builder, runner, builder_workers, stats, scratch)
        total = len(reports)
        watch = _InterruptWatch()
        try:
            watch.__enter__()
            for i, (t, tmod, key, rep) in enumerate(reports, 1):
                st = state["tasks"][key]
                prefix = f"[{i}/{total}] {t.task_name}:"
                remaining = trials - rep.trials
                exhausted_at = st.get("exhausted_at")
                if remaining <= 0 or (exhausted_at is not None and trials <= exhausted_at):
                    rep.status = "done" if remaining <= 0 else "exhausted"
                    printer.line(f"{prefix} {rep.trials}/{trials} trials, best {_ms(_s(rep.best_ms))} "
                                 f"(untuned {_ms(_s(rep.untuned_ms))}), {rep.status}", final=True)
                    continue
                t0 = time.perf_counter()
                n_before = rep.trials
                rep.status = "interrupted"  # until it returns
                try:
                    _tune_one(t, tmod, target, work_dir, remaining, num_trials_per_iter, model, builder, runner,
                              db, population_size, seed, num_threads,
                              _ProgressCallback(rep, prefix, printer, trials))
                except Exception as err:  # noqa: BLE001 - one failing task does not stop the others
                    if watch.is_interrupt(err):
                        raise KeyboardInterrupt(str(err)) from err
                    last = (str(err).strip().splitlines() or [""])[-1]
                    rep.status, rep.error = "failed", f"{type(err).__name__}: {last}"
                    log.warning("tuning %s failed: %s", t.task_name, err)
                finally:
                    rep.seconds = time.perf_counter() - t0
                    n, best = records.for_task(tmod)  # the database is the truth, not the callback's count
                    rep.new_trials, rep.trials = n - n_before, n
                    rep.best_ms = None if best is None else best * 1e3
                    st["seconds"] = float(st.get("seconds", 0.0)) + rep.seconds
                    if persistent_model:
                        _save_cost_model(model, work_dir)
                    _write_state(work_dir, state)
                if rep.status == "interrupted":  # returned normally
                    rep.status = "tuned"
                    if rep.trials < trials:
                        rep.status = "exhausted"
                        st["exhausted_at"] = rep.trials
                        _write_state(work_dir, state)
                printer.line(f"{prefix} {rep.trials}/{trials} trials, best {_ms(_s(rep.best_ms))} (untuned "
                             f"{_ms(_s(rep.untuned_ms))}), {rep.seconds:.1f} s, {rep.status}", final=True)
        except KeyboardInterrupt as err:
            report.interrupted = True
            printer.close()
            report.seconds = time.perf_counter() - t_start
            report.stats = stats.as_dict()
            raise KeyboardInterrupt(str(err), report) from None
        finally:
            watch.__exit__(None, None, None)
            shutil.rmtree(scratch, ignore_errors=True)
            printer.close()
            for t, *_ in reports:
                _close_task_logger(t.task_name)
    report.seconds = time.perf_counter() - t_start
    report.stats = stats.as_dict()
    return report


def _s(v_ms):
    return None if v_ms is None else v_ms / 1e3


def _make_builder_runner(builder, runner, builder_workers: int, stats: BuildStats, scratch: str | None = None):
    """``"inprocess"`` / ``"local"`` (MetaSchedule's process pools, timed; they need ``cloudpickle``) or objects."""
    if builder == "inprocess":
        builder = InProcessBuilder(max_workers=builder_workers, export=(runner != "inprocess"), stats=stats,
                                   tmp_root=scratch)
    elif builder == "local":
        # generous timeout: each fresh worker imports every tensor intrinsic first (40 s to minutes)
        builder = TimedBuilder(ms.builder.LocalBuilder(max_workers=builder_workers, timeout_sec=1800.0), stats)
    if runner == "inprocess":
        runner = InProcessRunner(stats=stats)
    elif runner == "local":
        runner = TimedRunner(ms.runner.LocalRunner(timeout_sec=600.0), stats)
    return builder, runner


def _tune_one(task, task_mod, target, work_dir, trials, per_iter, model, builder, runner, db, population_size, seed,
              num_threads, progress_cb) -> None:
    batch = max(1, min(per_iter, trials))
    with tensor_intrinsics_for(target):
        ctx = ms.TuneContext(mod=task_mod, target=target, space_generator="post-order-apply",
                             search_strategy=_search_strategy(batch, population_size), task_name=task.task_name,
                             logger=_task_logger(work_dir, task.task_name),
                             rand_state=-1 if seed is None else int(seed), num_threads=num_threads).clone()
    callbacks = ms.measure_callback.MeasureCallback.create("default") + [progress_cb]
    ms.tune_tasks(tasks=[ctx], task_weights=[1.0], work_dir=work_dir, max_trials_global=trials,
                  max_trials_per_task=trials, num_trials_per_iter=batch, builder=builder, runner=runner,
                  database=db, cost_model=model, measure_callbacks=callbacks, task_scheduler="round-robin")


# ----------------------------------------------------------------------------------------------- apply
def apply_database(mod: tvm.IRModule, target="llvm", work_dir: str = "tuning_db", *, prefer_faster: bool = True,
                   strict_device: bool = False) -> tvm.IRModule:
    """``mod`` (a prepared module) with each PrimFunc that has a record in the database at ``work_dir`` replaced
    by its best tuned version.

    The database is queried with the unscheduled kernels (what was tuned, see :func:`_tuning_source`). GlobalVar
    names, the Relax functions, module attributes (the unscheduled originals included) and each function's own
    attributes are kept; a tuned function gets ``tirx.is_scheduled`` and ``tvm_interop.tuned``. Functions without
    a record keep the prepared module's version. ``prefer_faster``: where the kernel that ships untuned (the
    prepared function's ``cpu_schedule``; on CUDA DLight's, timed in a tuning bundle) measured faster than the best
    tuned record when it was tuned (same runner, see the tuning state), the default is kept. Raises TuningError if ``work_dir`` holds no database or was tuned
    for another kind of target."""
    from tvm import relax

    target = tuning_target(target)
    state = _read_state(work_dir) or {}
    _check_target(state, target, work_dir, strict_device)
    db = _open_database(work_dir, create=False)
    if state.get("target"):  # query with the tuning target (num-cores as tuned)
        with contextlib.suppress(Exception):
            tuned_t = tvm.target.Target(json.loads(state["target"]))
            if tuned_t.kind.name == target.kind.name:
                target = tuned_t
    src = _tuning_source(mod)
    with target, db, tvm.transform.PassContext(opt_level=3):
        new = relax.transform.MetaScheduleApplyDatabase(enable_warning=False)(src)
    out = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
    tuned, kept = [], []
    for gv, func in src.functions.items():
        if not isinstance(func, tvm.tirx.PrimFunc) or _is_scheduled(func):
            continue
        newf = new[gv.name_hint]
        if newf.same_as(func) or not _is_scheduled(newf):
            continue  # no record: keep the prepared module's function (e.g. its default CPU schedule)
        # the default is kept where it measured faster: a CPU kernel's cpu_schedule (in the prepared module), and
        # a CUDA kernel's DLight schedule (applied by the build to a kernel left unscheduled; timed in a bundle)
        ships_default = (not mod[gv].same_as(func) and _is_scheduled(mod[gv])) or target.kind.name == "cuda"
        if prefer_faster and ships_default:
            task_mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
            info = state.get("tasks", {}).get(ms.utils.shash2hex(task_mod), {})
            default_ms = info.get("default_ms")
            best = None
            if db.has_workload(task_mod):
                top = db.get_top_k(db.commit_workload(task_mod), 1)
                best = _record_seconds(top[0]) if top else None
            if default_ms is not None and best is not None and best * 1e3 >= default_ms:
                kept.append(gv.name_hint)
                continue
        attrs = dict(func.attrs or {})
        attrs.update(dict(newf.attrs or {}))
        attrs.update({"tirx.is_scheduled": True, TUNED_ATTR: True})
        out[gv] = newf.with_attrs(attrs) if hasattr(newf, "with_attrs") else _with_attrs(newf, attrs)
        tuned.append(gv.name_hint)
    log.info("apply_database: %d tuned PrimFunc(s) from %s%s", len(tuned), work_dir,
             f"; default schedule kept (faster than tuned) for {kept}" if kept else "")
    return out


def _with_attrs(func, attrs: dict):
    for k, v in attrs.items():
        func = func.with_attr(k, v)
    return func


def tuned_functions(mod: tvm.IRModule) -> list[str]:
    """Names of the PrimFuncs of ``mod`` that :func:`apply_database` replaced."""
    return sorted(gv.name_hint for gv, f in mod.functions.items()
                  if isinstance(f, tvm.tirx.PrimFunc) and f.attrs is not None and TUNED_ATTR in f.attrs)


def database_summary(work_dir: str) -> dict:
    """Workloads, records and the state file of a tuning database (for reports; no TVM objects)."""
    def count(name):
        p = os.path.join(work_dir, name)
        if not os.path.exists(p):
            return 0
        with open(p, "rb") as f:
            return sum(1 for ln in f if ln.strip())

    return {"work_dir": os.path.abspath(work_dir), "workloads": count(WORKLOAD_FILE), "records": count(RECORD_FILE),
            "state": _read_state(work_dir)}
