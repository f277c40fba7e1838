"""Arguments and output helpers shared by the sub-commands."""
from __future__ import annotations

import json
import sys


def add_model_args(p) -> None:
    p.add_argument("model", help="zoo model name (see `tvm-interop models`) or a path to an .onnx file")
    p.add_argument("--batch", type=int, default=1, help="batch size (default 1)")
    p.add_argument("--image-size", type=int, default=None, help="input height/width (default: the model's)")
    p.add_argument("--width", type=float, default=1.0, help="channel-width multiplier for zoo models (default 1.0)")


def print_json(obj) -> None:
    json.dump(obj, sys.stdout, indent=1)
    sys.stdout.write("\n")


def status(args, message: str) -> None:
    """Progress line on stderr; silent with --quiet or --json, or when stderr is not a terminal."""
    if getattr(args, "quiet", False) or getattr(args, "json", False):
        return
    if sys.stderr.isatty():
        print(message, file=sys.stderr, flush=True)
