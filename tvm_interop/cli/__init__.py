"""The ``tvm-interop`` command line. Each sub-command lives in its own module with a ``register`` function."""
from __future__ import annotations

import argparse
import importlib
import logging
import sys

from tvm_interop.runtime.errors import InteropError

_COMMANDS = ["compile_cmd", "run_cmd", "models_cmd", "schedule_cmd", "show_cmd", "tune_cmd", "profile_cmd", "pick_cmd", "devices_cmd"]

EPILOG = """examples:
  tvm-interop models
  tvm-interop compile inception_v3 --target llvm --scheduler greedy -o m.so --schedule-out s.json
  tvm-interop run m.so --repeat 20
  tvm-interop pick m_cuda.so            # on the GPU: time the candidate programs, keep the fastest
  tvm-interop schedule nasnet_a_large --scheduler ios --cost sim:h100 --json
  tvm-interop show s.json
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tvm-interop",
        description="Inter-operator scheduling for Apache TVM Relax: compile, schedule, run and inspect models.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMANDS:
        try:
            mod = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"{__name__}.{name}":
                continue
            raise
        mod.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except InteropError as e:
        print(f"tvm-interop {args.command}: error: {e}", file=sys.stderr)
        library = getattr(args, "library", None)
        if library and str(e).startswith("no CUDA device"):
            print(f"(`tvm-interop show {library}` says what the library holds without a GPU)", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"tvm-interop {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
