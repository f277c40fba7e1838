"""Arguments and output helpers shared by the sub-commands."""
from __future__ import annotations

import contextlib
import json
import logging
import os
import sys

# loggers whose INFO lines are the progress of long compile-time work (timed searches, the guard)
PROGRESS_LOGGERS = ("tvm_interop.passes.cost.measured", "tvm_interop.passes.cost.learned", "tvm_interop.passes.schedulers.active", "tvm_interop")


def add_model_args(p) -> None:
    p.add_argument("model", help="zoo model name (see `tvm-interop models`) or a path to an .onnx file")
    p.add_argument("--batch", type=int, default=1, help="batch size (default 1)")
    p.add_argument("--image-size", type=int, default=None, help="input height/width (default: the model's)")
    p.add_argument("--width", type=float, default=1.0, help="channel-width multiplier for zoo models (default 1.0)")


def add_layout_arg(p, default: str | None, what: str) -> None:
    """``--layout``: the activation layout of the CPU build (``passes.layout``); ``what`` says what it is for."""
    p.add_argument("--layout", default=default, type=layout_arg,
                   help=f"{what}: activations between convolutions in NCHW[c]c, c = the vector width (auto, "
                        "as ONNX Runtime does; nchw<N>c: block N), or in TVM's NCHW (nchw); inputs and outputs "
                        "keep the model's layout")


def layout_arg(text: str) -> str:
    """argparse type of ``--layout``: the message names the choices."""
    import argparse

    from tvm_interop.passes.layout import check_layout

    try:
        return check_layout(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def parse_tuning_databases(items: list[str]) -> dict[str, str]:
    """``MODEL=DIR`` pairs (a ``--tuned`` option given several times) as {model: tuning database directory}."""
    from tvm_interop.runtime.errors import InteropError

    out = {}
    for item in items:
        model, sep, path = item.partition("=")
        if not sep or not os.path.isdir(path):
            raise InteropError(f"--tuned wants MODEL=DIR with an existing tuning database directory, got {item!r}")
        out[model] = path
    return out


def print_json(obj) -> None:
    json.dump(obj, sys.stdout, indent=1)
    sys.stdout.write("\n")


def status(args, message: str) -> None:
    """Progress line on stderr; silent with --quiet or --json, or when stderr is not a terminal."""
    if getattr(args, "quiet", False) or getattr(args, "json", False):
        return
    if sys.stderr.isatty():
        print(message, file=sys.stderr, flush=True)


@contextlib.contextmanager
def progress_logging(args, force: bool = False):
    """Show the INFO lines of :data:`PROGRESS_LOGGERS` on stderr while the block runs (a measured search or a
    learned search's rounds take minutes). Same rule as :func:`status`: not with --quiet / --json, and only on a
    terminal unless ``force``; with --verbose every INFO line is already shown."""
    show = force or sys.stderr.isatty()
    if getattr(args, "quiet", False) or getattr(args, "json", False) or getattr(args, "verbose", False) or not show:
        yield
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("  %(message)s"))
    handler.setLevel(logging.INFO)
    saved = []
    for name in PROGRESS_LOGGERS:
        lg = logging.getLogger(name)
        saved.append((lg, lg.level, lg.propagate))
        if lg.getEffectiveLevel() > logging.INFO:
            lg.setLevel(logging.INFO)
        lg.propagate = False  # shown once, by this handler, not again by the root logger's
        lg.addHandler(handler)
    try:
        yield
    finally:
        for lg, level, propagate in saved:
            lg.removeHandler(handler)
            lg.setLevel(level)
            lg.propagate = propagate


def add_rpc_args(p, what: str) -> None:
    """``--rpc HOST:PORT --device-key KEY`` and the fleet's limits (see ``passes.fleet``)."""
    g = p.add_argument_group("fleet (TVM RPC tracker)")
    g.add_argument("--rpc", default=None, metavar="HOST:PORT",
                   help=f"{what} on the devices of an RPC tracker instead of this machine")
    g.add_argument("--device-key", default=None, metavar="KEY", help="device key on the tracker (with --rpc)")
    g.add_argument("--max-devices", type=int, default=None, help="use at most N devices of the key (default all)")
    g.add_argument("--device-wait", type=float, default=60.0,
                   help="seconds to wait for a free device (default 60)")
    g.add_argument("--measure-timeout", type=float, default=600.0,
                   help="seconds one measurement may take on a device before it is retried elsewhere (default 600)")


@contextlib.contextmanager
def fleet_from_args(args):
    """A started fleet for ``--rpc`` (None without it), closed when the block ends; its report is on
    ``args.fleet_report`` afterwards."""
    if not getattr(args, "rpc", None):
        if getattr(args, "device_key", None):
            from tvm_interop.runtime.errors import InteropError

            raise InteropError("--device-key needs --rpc HOST:PORT")
        yield None
        return
    from tvm_interop.passes.fleet import Fleet, FleetOptions
    from tvm_interop.runtime.errors import InteropError

    if not args.device_key:
        raise InteropError("--rpc needs --device-key KEY (see `tvm-interop devices --rpc HOST:PORT`)")
    opts = FleetOptions(max_devices=args.max_devices, device_wait=args.device_wait, call_timeout=args.measure_timeout)
    fleet = Fleet(args.rpc, args.device_key, opts)
    try:
        fleet.start()
        status(args, f"fleet: {len(fleet.devices)} device(s) under {args.device_key!r} ({fleet.fingerprint})"
               + (f", {len(fleet.refused)} refused" if fleet.refused else ""))
        yield fleet
    finally:
        fleet.close()
        args.fleet_report = fleet.report()


def fleet_line(report: dict) -> str:
    """One line on what a fleet job used: devices and their item counts, retries, losses, refusals."""
    devs = ", ".join(f"{d['address']} x{d['items']}" for d in report["devices"])
    line = (f"fleet {report['tracker']} key {report['key']} ({report['fingerprint']}): {report['items']} items on "
            f"{len(report['devices'])} device(s) [{devs}] in {report['seconds']:.1f} s")
    if report["retries"] or report["lost"]:
        line += f"; {len(report['lost'])} device(s) lost, {report['retries']} item(s) retried elsewhere"
    if report["failed"]:
        line += f"; {report['failed']} item(s) failed"
    for r in report["refused"]:
        line += f"\n  refused {r['address']}: {r['fingerprint']} (the key's devices are {r['expected']})"
    return line
