"""Measuring on a fleet of devices through TVM's RPC tracker (``--rpc HOST:PORT --device-key KEY``).

Kernels, stage programs and bundles are built here; devices run ``python -m tvm_interop.runtime.rpc_server``
(TVM's runtime only) and register with a tracker (``python -m tvm.exec.rpc_tracker``). :class:`Fleet` hands
work to every free device of a key, retries what a lost device had in flight, and refuses devices whose
fingerprint differs from the others. The jobs: tuning candidates (:mod:`.runner`), profiling-bundle stages
(:mod:`.bundle`), measured-cost stages (:mod:`.stage_timer`) and the never-slower guard (:mod:`.guard`).
"""
from .device import DeviceLost, RemoteCallError, RemoteDevice
from .pool import Fleet, FleetOptions
from .tracker import FleetError, TrackerAddress, check_key, key_counts

__all__ = ["Fleet", "FleetOptions", "FleetError", "TrackerAddress", "RemoteDevice", "DeviceLost", "RemoteCallError",
           "check_key", "key_counts"]
