"""The build does not group our kernels again (``passes.keep_kernels``): TVM 0.27's ``FuseOps`` wrapped kernels
that read items of a multi-output call into new functions, nondeterministically and sometimes malformed, and
``FuseTIR`` then failed (6-7 of 60 reloads of a wave-fused Inception-v3 program)."""
import pytest
import tvm
from tvm import relax

from tvm_interop.api import prepare_program
from tvm_interop.models import get_model, small_config
from tvm_interop.passes.as_built import as_built_ir, memory_report, run_until
from tvm_interop.passes.keep_kernels import OPAQUE, keep_kernels_pass
from tvm_interop.passes.schedulers import schedule_graph
from tvm_interop.passes.target import normalize_target
from tvm_interop.passes.wave import apply_wave_fusion

HOST = normalize_target("llvm")


def _primitive_functions(mod: tvm.IRModule) -> list[str]:
    return sorted(gv.name_hint for gv, f in mod.functions.items()
                  if isinstance(f, relax.Function) and f.attrs is not None and "Primitive" in f.attrs)


def _callees(func) -> list[str]:
    """The kernels ``func`` calls, in order."""
    out = []
    relax.analysis.post_order_visit(func, lambda e: out.append(e.args[0].name_hint) if isinstance(e, relax.Call)
                                    and e.op.same_as(tvm.ir.Op.get("relax.call_tir")) else None)
    return out


def _until_fuse_ops(passes: list, mod: tvm.IRModule) -> tvm.IRModule:
    names = [p.info.name for p in passes]
    with HOST:
        return tvm.transform.Sequential(passes[:names.index("FuseOps") + 1])(mod)


@pytest.fixture(scope="module")
def wave_fused_inception():
    """Inception-v3 (small) with every greedy stage wave-fused: its concatenations read items of the fused
    calls' results, the pattern TVM's FuseOps regrouped."""
    program = prepare_program(get_model("inception_v3", **small_config("inception_v3")), HOST, name="inception_v3")
    sched = schedule_graph(program.graph, "greedy", "sim:cpu", model_name="inception_v3")
    fused, fused_sched, records = apply_wave_fusion(program, sched, HOST)
    assert any(r.fused for r in records)
    return fused, fused_sched


def test_tvms_own_pipeline_regroups_the_fused_programs_kernels(wave_fused_inception):
    """The precondition: without the pass, TVM's FuseOps wraps some of our finished kernels in new functions
    (if a TVM upgrade stops doing so, this test says the pass may be obsolete)."""
    from tvm.relax.backend.cpu_generic import pipeline as cpu

    program, _ = wave_fused_inception
    tvm_passes = (cpu.library_dispatch_passes(HOST) + cpu.legalize_passes(HOST) + cpu.dataflow_lower_passes(HOST)
                  + cpu.finalize_passes(HOST))
    assert _primitive_functions(_until_fuse_ops(tvm_passes, program.mod))


def test_the_build_leaves_every_kernel_as_it_is(wave_fused_inception):
    program, _ = wave_fused_inception
    mod = run_until(program.mod, HOST, "FuseOps")
    assert _primitive_functions(mod) == []
    after = run_until(program.mod, HOST, "FuseTIR")
    assert _callees(after["main"]) == _callees(program.mod["main"])   # the same kernels, called as before


def test_the_as_built_ir_of_a_wave_fused_main_is_the_same_on_every_reload(wave_fused_inception):
    """FuseOps' grouping depended on where objects lay in memory: a module reloaded from JSON lies elsewhere."""
    import tvm_ffi

    program, sched = wave_fused_inception
    text = tvm.ir.save_json(program.mod)
    hashes = {tvm_ffi.structural_hash(as_built_ir(tvm.ir.load_json(text), HOST)) for _ in range(4)}
    assert len(hashes) == 1
    rep = memory_report(program, sched, HOST)
    assert rep["sequential_bytes"] > 0 and rep["scheduled_bytes"] > 0


def test_kernels_the_pipeline_legalizes_are_still_fused_by_tvm():
    """Only the kernels already in the module are kept: Relax operators legalized by the pipeline fuse as usual,
    and the kernels' bodies do not change."""
    from tvm.script import relax as R

    @tvm.script.ir_module
    class Mod:
        @R.function
        def main(x: R.Tensor((4, 8), "float32")) -> R.Tensor((4, 8), "float32"):
            with R.dataflow():
                y = R.add(x, x)
                z = R.nn.relu(y)
                R.output(z)
            return z

    legalized = relax.transform.LegalizeOps()(Mod)   # two kernels, as a prepared program has them
    kept = keep_kernels_pass()(legalized)
    for gv, f in legalized.functions.items():
        if isinstance(f, tvm.tirx.PrimFunc):
            assert int(kept[gv.name_hint].attrs["op_pattern"]) == OPAQUE
            tvm.ir.assert_structural_equal(kept[gv.name_hint].body, f.body)
    assert _primitive_functions(run_until(legalized, HOST, "FuseOps")) == []
    assert len(_primitive_functions(run_until(Mod, HOST, "FuseOps"))) == 1   # add + relu, legalized in the build


def test_every_build_pipeline_starts_by_keeping_the_kernels():
    from tvm_interop.passes.as_built import pipeline_passes

    for target in ("llvm", "cuda"):
        assert pipeline_passes(target)[0].info.name == "InteropKeepKernels", target


def test_a_wave_fused_cuda_program_keeps_its_kernels_too():
    """The CUDA pipeline (DLight, graphs) runs the same FuseOps: a fused stage's outputs read by a concatenation
    are left alone there as well (no GPU needed up to FuseOps)."""
    cuda = normalize_target("cuda")
    program = prepare_program(get_model("inception_v3", **small_config("inception_v3")), cuda, name="inception_v3")
    sched = schedule_graph(program.graph, "greedy", "sim:h100", model_name="inception_v3")
    fused, _, records = apply_wave_fusion(program, sched, cuda)
    assert any(r.fused for r in records)
    assert _primitive_functions(run_until(fused.mod, cuda, "FuseOps")) == []
    assert _callees(run_until(fused.mod, cuda, "FuseTIR")["main"]) == _callees(fused.mod["main"])
