"""``tvm-interop devices --rpc HOST:PORT``: what an RPC tracker has (keys, servers, free / busy, device names)."""
from __future__ import annotations

from .common import print_json

EPILOG = """a fleet, end to end:
  python -m tvm.exec.rpc_tracker --host 0.0.0.0 --port 9190                     # one machine (pip install tornado cloudpickle)
  python -m tvm_interop.runtime.rpc_server --tracker HOST:9190 --key h100       # each device machine (TVM runtime only)
  tvm-interop devices --rpc HOST:9190
  tvm-interop tune inception_v3 --target cuda --db tuned/ --rpc HOST:9190 --device-key h100
"""


def register(sub) -> None:
    p = sub.add_parser("devices", help="list the device servers an RPC tracker has",
                       description="List the servers registered with an RPC tracker: key, address, free or busy, "
                                   "and for free ones the device (asked through a short session).",
                       epilog=EPILOG, formatter_class=__import__("argparse").RawDescriptionHelpFormatter)
    p.add_argument("--rpc", required=True, metavar="HOST:PORT", help="the tracker")
    p.add_argument("--no-probe", action="store_true", help="do not open sessions to ask free servers what they are")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    from tvm_interop.passes.fleet.inventory import list_devices

    rows = list_devices(args.rpc, probe=not args.no_probe)
    if args.json:
        print_json({"tracker": args.rpc, "servers": rows})
        return 0
    servers = [r for r in rows if "address" in r]
    if not servers:
        print(f"the tracker at {args.rpc} has no device servers")
        return 0
    print(f"{'key':<12} {'server':<22} {'state':<6} device")
    for r in servers:
        what = r.get("error") or (f"{r['device_name']} on {r['host']} ({r['fingerprint']})" if "fingerprint" in r else "")
        print(f"{r['key']:<12} {r['address']:<22} {r['state']:<6} {what}")
    for r in rows:
        if "summary" in r:
            print(f"{r['key']}: {r['summary']}")
    return 0
