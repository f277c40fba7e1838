"""A CPU interpreter for the CUDA kernels a build hands to TVM's CUDA codegen, with race and barrier checks.

Why: the flow and wave launches (``passes/wave``) change what runs inside a kernel: block indices re-derived, blocks
repacked, tasks taken from a counter, waits on other blocks' counters. A GPU run finds a mistake as a wrong number
at best; a race may even pass there by luck. This package runs the very device IR that the build compiles (the
``IRModule`` TVM passes to ``target.build.cuda``, captured by :func:`capture_build`) on NumPy:

* a block's threads run in lock step, one NumPy lane each (``if``/``while`` under a lane mask, so shared memory,
  ``__syncthreads`` and warp shuffles mean what they mean on the device); blocks run one after another in block
  order, which is the order in which a flow launch's blocks take their tasks;
* a ``__syncthreads`` reached by only some of a block's threads is an error (undefined on the device);
* shared memory: a thread reading an element that a thread of another warp wrote since the last barrier, or
  writing one that such a thread read, is a race (a missing barrier that lock step would hide);
* global memory: a block reading an element that another block of the same launch wrote is a race unless the
  reader waited for a counter that the writer (or a block that waited for it, transitively) counted up;
* a block that would have to wait (a poll that finds its producer unfinished, i.e. a ``__nanosleep``) is an
  error: blocks run in task order, so a producer is always finished first when the task layout is right;
* an out-of-bounds access by an active thread is an error; so is a launch whose grid or block differs from the
  thread extents its kernel was compiled for.

:func:`capture_build` takes both halves of a build: the device functions, and the host functions' launches
(kernel, the tensors passed, grid and block), so :meth:`Emulator.call` runs a unit the way its library does.

Memory is sequentially consistent here and fences do nothing: whether the device makes one block's writes visible
to another (fences, caches) is not modelled, nor speed, nor which blocks are resident at once.

It covers the IR that TVM's default CUDA schedules and ``passes/wave`` produce (scalars, vectors of lanes, lets,
serial loops, shared/local buffers, ``atomicAdd``, ``__ldcg``, warp shuffles, device-function calls) and refuses
anything else by name, so it never runs a kernel it does not understand.

The package: :mod:`.capture` (what a build compiled), :mod:`.interpreter` (statements and expressions, lock-step
lanes), :mod:`.calls` (intrinsics), :mod:`.memory` (allocations, bounds and race checks).
"""
from .capture import CapturedBuild, KernelLaunch, capture_build, host_launches
from .errors import EmulationError, Unsupported
from .interpreter import Emulator
from .memory import WARP, Launch, Pointer, Storage, global_pointer

__all__ = ["WARP", "CapturedBuild", "EmulationError", "Emulator", "KernelLaunch", "Launch", "Pointer", "Storage",
           "Unsupported", "capture_build", "global_pointer", "host_launches"]
