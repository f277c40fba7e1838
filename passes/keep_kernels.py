"""The build keeps our kernels as they are: TVM's ``FuseOps`` must not group them again.

Why: a program's kernels are already TVM's fused operators (``passes.prepare`` ran ``FuseOps`` + ``FuseTIR``),
then scheduled, merged or wave-fused by us: they are the units the scheduler placed and the cost models timed.
TVM's default pipeline for every target runs ``AnnotateTIROpPattern``, ``FuseOps`` and ``FuseTIR`` once more,
and in a dataflow ``main`` where a kernel reads items of a multi-output call (a wave-fused stage's outputs, a
merged convolution's split) TVM 0.27's ``FuseOps`` wraps that kernel and the ``TupleGetItem`` bindings into a
new function, and does it *nondeterministically*: the result depends on where objects lie in memory. Some of
those functions are malformed (a parameter list naming the wrong tuple's items, a body reading an undefined
variable), and ``FuseTIR`` then stopped with "Parameter expression T.int64(12) expected an integer argument with
value 12, but was provided with the argument T.int64(10)" in 6 and 7 of 60 reloads (two runs) of one wave-fused
Inception-v3 program (``tvm-interop compile --wave-fusion``'s memory report failed that way once); where the
shapes happen to agree, nothing would stop it from binding the wrong tensors. Marking every kernel already in the module
opaque (``op_pattern`` = ``kOpaque``, what ``AnnotateTIROpPattern`` gives a kernel it cannot analyse) makes
``FuseOps`` leave them alone, and the same 60 reloads all built. Kernels that the pipeline itself creates
(``LegalizeOps`` of a Relax operator) are annotated and fused by TVM as usual.

The stream-lowered functions that ship are not dataflow blocks, so ``FuseOps`` never grouped anything in them;
this pass changes what TVM does only where it would have regrouped finished kernels.
"""
from __future__ import annotations

import tvm
from tvm import tirx

OP_PATTERN = "op_pattern"
OPAQUE = 8   # relax's OpPatternKind.kOpaque


def keep_kernels_pass() -> tvm.transform.Pass:
    """A module pass marking every PrimFunc of the module opaque to ``FuseOps`` (a new module; Relax functions
    and the kernels' bodies untouched)."""

    @tvm.transform.module_pass(opt_level=0, name="InteropKeepKernels")
    def _keep(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        updates = {gv: f.with_attr(OP_PATTERN, OPAQUE) for gv, f in mod.functions.items()
                   if isinstance(f, tirx.PrimFunc) and not _is_opaque(f)}
        if not updates:
            return mod
        mod = mod.clone()
        for gv, func in updates.items():
            mod[gv] = func
        return mod

    return _keep


def _is_opaque(func: tirx.PrimFunc) -> bool:
    return func.attrs is not None and OP_PATTERN in func.attrs and int(func.attrs[OP_PATTERN]) == OPAQUE
