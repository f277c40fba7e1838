"""Tests of the substitution library (passes/substitutions): the dataflow view, the rewrite primitive, the
numeric proof, and every rule on random shapes (rewritten module vs original, built with TVM, 1e-5)."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_interop.passes.substitutions import (
    RULES,
    Match,
    Node,
    Rule,
    SubstitutionError,
    apply_match,
    check_match,
    clear_check_cache,
    dataflow_nodes,
    ensure_unique_names,
    find_matches,
    rewrite_main,
)
from tvm_interop.passes.substitutions.check import _run_tvm
from tvm_interop.passes.substitutions.numpy_eval import Unsupported, evaluate
from zoo_cases import zoo_params

op = relax.op


# ---------------------------------------------------------------------------------------------- helpers
class Net:
    """A tiny BlockBuilder wrapper for hand-made test graphs with seeded, fan-in scaled weights."""

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.bb = relax.BlockBuilder()

    def w(self, *shape) -> relax.Expr:
        fan_in = int(np.prod(shape[1:])) if len(shape) == 4 else shape[0]
        return relax.const((self.rng.standard_normal(shape) / np.sqrt(fan_in)).astype("float32"))

    def b(self, c: int, flat: bool = False) -> relax.Expr:
        shape = (c,) if flat else (1, c, 1, 1)
        return relax.const((0.1 * self.rng.standard_normal(shape)).astype("float32"))

    def conv(self, x, cin, cout, k=(1, 1), stride=1, pad=0, dilation=1, bias=True, relu=True, groups=1,
             name=None):
        k = (k, k) if isinstance(k, int) else k
        y = self.bb.emit(op.nn.conv2d(x, self.w(cout, cin // groups, *k), strides=stride, padding=pad,
                                      dilation=dilation, groups=groups), name_hint=name or "")
        if bias:
            y = self.bb.emit(op.add(y, self.b(cout)))
        if relu:
            y = self.bb.emit(op.nn.relu(y))
        return y


def build(shape, body, seed: int = 0) -> tvm.IRModule:
    """main(data: shape) with one dataflow block: ``body(net, data) -> result expr`` (a Tuple of vars gives a
    tuple result)."""
    net = Net(seed)
    x = relax.Var("data", relax.TensorType(shape, "float32"))
    with net.bb.function("main", [x]):
        with net.bb.dataflow():
            out = net.bb.emit_output(body(net, x))
        net.bb.emit_func_output(out)
    return net.bb.get()


def run(mod, x):
    """Rules are tested on TVM's builds (what ships), not on the proofs' numpy oracle."""
    return _run_tvm(mod, [x])


def assert_same(mod, new, shape, tol=1e-5, seed=1):
    x = np.random.default_rng(seed).standard_normal(shape).astype("float32")
    ref, got = run(mod, x), run(new, x)
    assert len(ref) == len(got)
    for a, b in zip(got, ref):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


def ops(mod) -> list[str]:
    return [n.op for n in dataflow_nodes(mod)]


def only(ms, rule):
    return [m for m in ms if m.rule == rule]


# ---------------------------------------------------------------------------------------------- the view
def test_registry_and_interface():
    assert {"merge_shared_input_convs", "merge_concat_convs", "merge_added_convs", "fuse_1x1_sequence",
            "merge_shared_input_matmuls", "split_conv", "split_matmul"} == set(RULES)
    for name, r in RULES.items():
        assert r.name == name and r.operators and r.legality
        assert isinstance(r, Rule)
        assert r.inverse_of is None or r.inverse_of in RULES


def test_dataflow_nodes_and_flops():
    def body(n, x):
        a = n.conv(x, 4, 8, 3, pad=1, name="c")
        p = n.bb.emit(op.nn.max_pool2d(a, pool_size=2, strides=2))
        g = n.bb.emit(op.mean(p, axis=[2, 3]))
        return op.matmul(g, n.w(8, 5))

    mod = build((1, 4, 8, 8), body)
    nodes = dataflow_nodes(mod)
    assert [n.op for n in nodes] == ["relax.nn.conv2d", "relax.add", "relax.nn.relu", "relax.nn.max_pool2d",
                                     "relax.mean", "relax.matmul"]
    conv = nodes[0]
    assert isinstance(conv, Node) and conv.name == "c" and conv.inputs == ("data",)
    assert conv.shape == (1, 8, 8, 8) and conv.dtype == "float32"
    assert conv.attrs["padding"] == (1, 1, 1, 1) and conv.attrs["groups"] == 1
    assert conv.flops == 2 * 8 * 8 * 8 * 4 * 9
    assert nodes[1].inputs == ("c",) and nodes[1].flops == 8 * 64  # constant bias left out
    assert nodes[3].flops == 8 * 16 * 4
    assert nodes[5].flops == 2 * 5 * 8
    hash(conv)  # hashable (attrs are frozen)


def _renamed(mod, rename: dict[str, str]) -> tvm.IRModule:
    """``mod`` with some bindings' variables renamed (BlockBuilder itself never makes duplicate names, other
    producers such as TVMScript or hand-built modules can)."""
    from tvm_interop.passes.substitutions.graph import substitute_vars

    f = mod["main"]
    bb = relax.BlockBuilder()
    vmap, new = {}, []
    for b in f.body.blocks[0].bindings:
        v = b.var
        nv = type(v)(rename[v.name], v.ty) if v.name in rename else v
        vmap[v] = nv
        new.append(relax.VarBinding(nv, bb.normalize(substitute_vars(b.value, vmap))))
    body = relax.SeqExpr([relax.DataflowBlock(new)], substitute_vars(f.body.body, vmap))
    out = mod.clone()
    out["main"] = relax.Function(f.params, body, f.ret_ty, attrs=f.attrs)
    return out


def test_ensure_unique_names():
    def body(n, x):
        a = n.bb.emit(op.nn.relu(x), name_hint="t")
        b = n.bb.emit(op.nn.relu(a), name_hint="u")
        c = n.bb.emit(op.add(a, b), name_hint="t_1")
        return op.multiply(c, b)

    mod = _renamed(build((1, 2, 3, 3), body), {"u": "t"})
    assert [b.var.name for b in mod["main"].body.blocks[0].bindings][:3] == ["t", "t", "t_1"]
    with pytest.raises(SubstitutionError, match="ensure_unique_names"):
        dataflow_nodes(mod)
    uniq = ensure_unique_names(mod)
    nodes = dataflow_nodes(uniq)
    assert [n.name for n in nodes][:3] == ["t", "t_2", "t_1"]
    assert nodes[2].inputs == ("t", "t_2")
    assert ensure_unique_names(uniq) is uniq
    assert_same(mod, uniq, (1, 2, 3, 3))


# ---------------------------------------------------------------------------------------------- rule 1
def _shared_input_body(n, x):
    a = n.conv(x, 6, 8, 1, name="a")
    b = n.conv(x, 6, 4, 3, pad=1, name="b")
    c = n.conv(x, 6, 5, (1, 3), pad=(0, 1), name="c")
    d = n.conv(x, 6, 3, 5, pad=2, name="d")
    e = n.conv(x, 6, 4, 3, pad=1, relu=False, name="e")    # other epilogue: not with a..d
    f = n.conv(x, 6, 4, 3, stride=2, pad=1, name="f")      # other stride
    cat = n.bb.emit(op.concat([a, b, c, d], axis=1))
    return relax.Tuple([cat, n.bb.emit(op.add(e, e)), f])


def test_merge_shared_input_convs_random():
    mod = build((1, 6, 9, 9), _shared_input_body)
    ms = only(find_matches(mod), "merge_shared_input_convs")
    heads = sorted(tuple(n for n in m.nodes if n in set("abcdef")) for m in ms)
    # maximal {a,b,c,d} + its 6 pairs; e and f have no partner
    assert ("a", "b", "c", "d") in heads and len(heads) == 7
    assert all(len(m.nodes) == 3 * len([n for n in m.nodes if n in set("abcd")]) for m in ms)
    big = next(m for m in ms if len(m.nodes) == 12)
    new = apply_match(mod, big)
    o = ops(new)
    assert o.count("relax.nn.conv2d") == 3 and o.count("relax.split") == 1
    assert_same(mod, new, (1, 6, 9, 9))
    # the untouched nodes keep their names
    assert {"e", "f"} <= {n.name for n in dataflow_nodes(new)}
    pair = next(m for m in ms if len(m.nodes) == 6 and "d" in m.nodes and "c" in m.nodes)
    assert_same(mod, apply_match(mod, pair), (1, 6, 9, 9))


@pytest.mark.parametrize("seed", [0, 1])
def test_merge_shared_input_convs_strided_dilated(seed):
    rng = np.random.default_rng(seed)
    k1, k2 = int(rng.choice([1, 3])), 3
    d = int(rng.choice([1, 2]))

    def body(n, x):
        a = n.conv(x, 3, 4, k1, stride=2, pad=d * (k1 // 2), dilation=d, bias=False, relu=False, name="a")
        b = n.conv(x, 3, 6, k2, stride=2, pad=d * (k2 // 2), dilation=d, bias=False, relu=False, name="b")
        return op.concat([b, a], axis=1)

    mod = build((2, 3, 11, 11), body, seed)
    ms = only(find_matches(mod), "merge_shared_input_convs")
    assert len(ms) == 1 and ms[0].nodes == ("a", "b")
    assert_same(mod, apply_match(mod, ms[0]), (2, 3, 11, 11))


def test_merge_shared_input_convs_legality():
    def body(n, x):
        a = n.conv(x, 4, 4, 3, pad=0, name="a")          # valid 3x3: 5x5 output
        b = n.conv(x, 4, 4, 1, pad=0, name="b")          # 1x1: 7x7 output -> different size
        c = n.conv(x, 4, 4, 3, pad=1, groups=4, name="c")  # depthwise
        e = n.conv(x, 4, 4, 3, pad=2, dilation=2, bias=False, name="e")  # dilation 2, no bias: alone
        g = n.conv(x, 4, 4, 2, pad=1, dilation=2, name="g")  # 7x7, top padding 1 ...
        h = n.conv(x, 4, 4, 1, pad=0, dilation=2, name="h")  # ... and 0: not a whole tap apart at dilation 2
        return relax.Tuple([a, b, n.bb.emit(op.add(c, e)), g, h])

    mod = build((1, 4, 7, 7), body)
    assert only(find_matches(mod), "merge_shared_input_convs") == []
    from tvm_interop.passes.substitutions.chains import align_kernels, chain_at
    from tvm_interop.passes.substitutions.graph import DataflowGraph

    g = DataflowGraph(mod)
    assert "cannot be aligned" in align_kernels([chain_at(g, "g"), chain_at(g, "h")], (7, 7), (7, 7))
    with pytest.raises(SubstitutionError, match="merge_shared_input_convs.*not a legal match"):
        apply_match(mod, Match("merge_shared_input_convs", ("a", "b")), check=False)


def test_match_key_and_within():
    mod = build((1, 6, 9, 9), _shared_input_body)
    assert find_matches(mod, rules=["merge_shared_input_convs"], within={"a", "b"}) == []  # epilogues outside
    names = [n.name for n in dataflow_nodes(mod)]
    chain = set(names[0:6])  # a, b and their bias add + relu (emitted right after each conv)
    assert {"a", "b"} <= chain
    ms = find_matches(mod, rules=["merge_shared_input_convs"], within=chain)
    assert len(ms) == 1 and {"a", "b"} <= set(ms[0].nodes)
    assert ms[0].key.startswith("merge_shared_input_convs:a,")
    assert Match("r", ("x", "y"), (1, 2)).key == "r:x,y|1,2"


# ---------------------------------------------------------------------------------------------- the check
class _BadScale(Rule):
    """A wrong rewrite: replaces a relu by relu(x) * 1.5 (breaks numerics, keeps shapes)."""

    name = "bad_scale"
    operators = ("relax.nn.relu",)
    legality = "any relu"

    def matches(self, g, allowed):
        return [Match(self.name, (n,)) for n in g.order if g.op(n) == "relax.nn.relu"
                and (allowed is None or n in allowed)]

    def rewrite(self, g, match):
        (n,) = match.nodes

        def build_(em, get):
            r = em.emit(op.nn.relu(get(g.inputs[n][0])))
            return {n: em.emit(op.multiply(r, relax.const(np.float32(1.5))), replaces=n)}

        return rewrite_main(g.mod, match.nodes, build_, rule=self.name)


class _BadShape(_BadScale):
    """A wrong rewrite: the replacement has another shape."""

    name = "bad_shape"

    def rewrite(self, g, match):
        (n,) = match.nodes

        def build_(em, get):
            return {n: em.emit(op.mean(get(g.inputs[n][0]), axis=[1], keepdims=True), replaces=n)}

        return rewrite_main(g.mod, match.nodes, build_, rule=self.name)


def test_check_match_rejects_wrong_rewrites():
    clear_check_cache()
    mod = build((1, 4, 6, 6), lambda n, x: op.mean(n.conv(x, 4, 4, 3, pad=1), axis=[2, 3]))
    bad = _BadScale()
    (m,) = bad.find(mod)
    with pytest.raises(SubstitutionError, match="bad_scale.*differs"):
        check_match(mod, m, rule=bad)
    with pytest.raises(SubstitutionError, match="bad_scale.*cached"):
        check_match(mod, m, rule=bad)
    with pytest.raises(SubstitutionError, match="bad_scale"):
        apply_match(mod, m, rule=bad)
    # without the check, the wrong module is produced (the check is what stops it)
    assert "relax.multiply" in ops(apply_match(mod, m, check=False, rule=bad))
    shp = _BadShape()
    (m2,) = shp.find(mod)
    with pytest.raises(SubstitutionError, match="bad_shape"):
        check_match(mod, m2, rule=shp)
    with pytest.raises(SubstitutionError, match="bad_shape"):
        apply_match(mod, m2, check=False, rule=shp)


def test_check_match_cache_by_structure(monkeypatch):
    clear_check_cache()
    import tvm_interop.passes.substitutions.check as chk

    calls = []
    real = chk._run
    monkeypatch.setattr(chk, "_run", lambda mod, xs: calls.append(1) or real(mod, xs))

    def body(n, x):  # two identical inception-like branches on two different inputs
        outs = []
        for src in (x, n.bb.emit(op.nn.relu(x))):
            outs.append(op.concat([n.conv(src, 4, 4, 1), n.conv(src, 4, 4, 3, pad=1)], axis=1))
        return op.add(n.bb.emit(outs[0]), n.bb.emit(outs[1]))

    mod = build((1, 4, 6, 6), body)
    ms = only(find_matches(mod), "merge_shared_input_convs")
    assert len(ms) == 2
    for m in ms:
        check_match(mod, m)
    assert len(calls) == 2  # original + rewritten region, once


# ---------------------------------------------------------------------------------------------- rule 2
def test_merge_concat_convs_whole_and_partial():
    def body(n, x):
        a = n.conv(x, 5, 4, 1, name="a")
        b = n.conv(x, 5, 6, 3, pad=1, name="b")
        c = n.conv(x, 5, 3, 5, pad=2, name="c")
        whole = n.bb.emit(op.concat([a, b, c], axis=1), name_hint="whole")
        p = n.bb.emit(op.nn.max_pool2d(x, pool_size=3, strides=1, padding=1), name_hint="pool")
        d = n.conv(x, 5, 4, 3, pad=1, bias=False, name="d")
        e = n.conv(x, 5, 2, 1, bias=False, name="e")
        f = n.conv(x, 5, 2, 1, name="f")  # other epilogue: ends the run
        part = n.bb.emit(op.concat([p, d, e, f], axis=1), name_hint="part")
        return relax.Tuple([whole, part])

    mod = build((1, 5, 7, 7), body)
    ms = only(find_matches(mod), "merge_concat_convs")
    assert len(ms) == 2
    m_whole = next(m for m in ms if "whole" in m.nodes)
    m_part = next(m for m in ms if "part" in m.nodes)
    assert {"a", "b", "c"} <= set(m_whole.nodes) and len(m_whole.nodes) == 10
    assert {"d", "e"} <= set(m_part.nodes) and "f" not in m_part.nodes
    new = apply_match(mod, m_whole)
    o = ops(new)
    assert o.count("relax.concat") == 1 and "relax.split" not in o and o.count("relax.nn.conv2d") == 4
    assert_same(mod, new, (1, 5, 7, 7))
    new2 = apply_match(new, m_part)
    assert ops(new2).count("relax.concat") == 1 and ops(new2).count("relax.nn.conv2d") == 3
    assert_same(mod, new2, (1, 5, 7, 7))


def test_merge_concat_convs_field_order():
    def body(n, x):
        a = n.conv(x, 3, 4, 1, name="a")
        b = n.conv(x, 3, 5, 3, pad=1, name="b")
        c = n.conv(x, 3, 6, 1, name="c")
        return op.concat([c, a, b], axis=1)  # not program order

    mod = build((1, 3, 5, 5), body)
    (m,) = only(find_matches(mod), "merge_concat_convs")
    new = apply_match(mod, m)
    assert "relax.concat" not in ops(new)
    assert_same(mod, new, (1, 3, 5, 5))


def test_merge_concat_convs_legality():
    def body(n, x):
        a = n.conv(x, 4, 4, 1, name="a")
        b = n.conv(x, 4, 4, 1, name="b")
        cat = n.bb.emit(op.concat([a, b], axis=1), name_hint="cat")  # a also read elsewhere
        y = n.bb.emit(op.nn.relu(x))
        c = n.conv(y, 4, 4, 1, name="c")
        d = n.conv(x, 4, 4, 1, name="d")  # reads another tensor than c
        cat2 = n.bb.emit(op.concat([c, d], axis=1), name_hint="cat2")
        return relax.Tuple([cat, a, cat2])

    mod = build((1, 4, 5, 5), body)
    assert only(find_matches(mod), "merge_concat_convs") == []


# ---------------------------------------------------------------------------------------------- rule 3
@pytest.mark.parametrize("case", ["bias_both", "bias_one", "none"])
def test_merge_added_convs(case):
    def body(n, x):
        y = n.bb.emit(op.nn.max_pool2d(x, pool_size=3, strides=1, padding=1), name_hint="y")
        z = n.bb.emit(op.multiply(y, relax.const(np.float32(0.5))), name_hint="z")
        a = n.conv(y, 3, 6, 3, stride=2, pad=1, bias=case != "none", relu=False, name="a")
        b = n.conv(z, 3, 6, 1, stride=2, bias=case == "bias_both", relu=False, name="b")
        s = n.bb.emit(op.add(a, b), name_hint="s")
        r = n.conv(x, 3, 6, 3, stride=2, pad=1, relu=True, name="r")  # a relu: not linear
        t = n.conv(x, 3, 6, 1, stride=2, relu=False, name="t")
        return relax.Tuple([s, n.bb.emit(op.add(r, t))])

    mod = build((2, 3, 9, 9), body)
    ms = only(find_matches(mod), "merge_added_convs")
    assert len(ms) == 1 and {"a", "b", "s"} <= set(ms[0].nodes)
    new = apply_match(mod, ms[0])
    o = ops(new)
    assert o.count("relax.nn.conv2d") == 3 and o.count("relax.concat") == 1
    assert_same(mod, new, (2, 3, 9, 9))


# ---------------------------------------------------------------------------------------------- rule 4
@pytest.mark.parametrize("inner_bias,outer_bias,strides", [(True, True, (1, 1)), (False, True, (1, 2)),
                                                           (True, False, (2, 1)), (False, False, (1, 1))])
def test_fuse_1x1_sequence(inner_bias, outer_bias, strides):
    def body(n, x):
        a = n.conv(x, 6, 10, 1, stride=strides[0], bias=inner_bias, relu=False, name="inner")
        b = n.conv(a, 10, 4, 1, stride=strides[1], bias=outer_bias, relu=True, name="outer")
        c = n.conv(x, 6, 4, 1, bias=True, relu=True, name="lone")  # its user adds a nonlinearity
        d = n.conv(c, 4, 4, 1, name="after_relu")
        return relax.Tuple([b, d])

    mod = build((1, 6, 7, 7), body)
    ms = only(find_matches(mod), "fuse_1x1_sequence")
    assert len(ms) == 1 and {"inner", "outer"} <= set(ms[0].nodes)
    assert len(ms[0].nodes) == 2 + inner_bias + outer_bias
    new = apply_match(mod, ms[0])
    assert ops(new).count("relax.nn.conv2d") == 3 and ops(new).count("relax.nn.relu") == 3
    assert_same(mod, new, (1, 6, 7, 7))


def test_fuse_1x1_sequence_legality():
    def body(n, x):
        a = n.conv(x, 4, 4, 1, relu=False, name="a")
        b = n.conv(a, 4, 4, 1, pad=1, relu=False, name="b")  # padded outer
        c = n.conv(x, 4, 4, 1, relu=False, name="c")
        d = n.conv(c, 4, 4, 1, relu=False, name="d")
        e = n.bb.emit(op.nn.relu(c))                          # c read twice
        f = n.conv(x, 4, 4, 3, pad=1, relu=False, name="f")
        h = n.conv(f, 4, 4, 1, relu=False, name="h")         # inner 3x3
        return relax.Tuple([b, d, e, h])

    assert only(find_matches(build((1, 4, 5, 5), body)), "fuse_1x1_sequence") == []


# ---------------------------------------------------------------------------------------------- rule 5
def _dense(n, x, k, m, bias=True, relu=False, flat_bias=True, name=""):
    y = n.bb.emit(op.matmul(x, n.w(k, m)), name_hint=name)
    if bias:
        b = n.b(m, flat=True)
        y = n.bb.emit(op.add(y, b if flat_bias else relax.const(b.value.numpy().reshape(1, m))))
    if relu:
        y = n.bb.emit(op.nn.relu(y))
    return y


@pytest.mark.parametrize("shape", [(2, 12), (2, 3, 12)])
def test_merge_shared_input_matmuls(shape):
    def body(n, x):
        a = _dense(n, x, 12, 5, relu=True, name="a")
        b = _dense(n, x, 12, 7, relu=True, flat_bias=len(shape) == 2, name="b")
        c = _dense(n, x, 12, 3, relu=True, name="c")
        d = _dense(n, x, 12, 4, bias=False, name="d")  # other epilogue
        return relax.Tuple([a, b, c, d])

    mod = build(shape, body)
    ms = only(find_matches(mod), "merge_shared_input_matmuls")
    assert sorted(len(m.nodes) for m in ms) == [6, 6, 6, 9]  # 3 pairs + the maximal set
    big = next(m for m in ms if len(m.nodes) == 9)
    new = apply_match(mod, big)
    o = ops(new)
    assert o.count("relax.matmul") == 2 and o.count("relax.split") == 1
    assert_same(mod, new, shape)
    pair = next(m for m in ms if {"a", "c"} <= set(m.nodes))
    assert_same(mod, apply_match(mod, pair), shape)


# ---------------------------------------------------------------------------------------------- rule 6
def test_split_conv_and_back():
    def body(n, x):
        a = n.conv(x, 3, 32, 3, pad=1, name="a")
        b = n.conv(x, 3, 30, 3, pad=1, name="b")                       # too narrow
        c = n.conv(x, 3, 33, 1, bias=False, relu=False, name="c")      # odd
        d = n.conv(x, 3, 32, 3, pad=1, groups=1, bias=False, name="d")
        return relax.Tuple([a, b, c, d])

    mod = build((1, 3, 6, 6), body)
    ms = only(find_matches(mod), "split_conv")
    assert sorted(m.nodes[0] for m in ms) == ["a", "d"] and ms[0].params == (16, 16)
    m = next(m for m in ms if m.nodes[0] == "a")
    new = apply_match(mod, m)
    o = ops(new)
    assert o.count("relax.nn.conv2d") == 5 and o.count("relax.concat") == 1 and o.count("relax.nn.relu") == 4
    assert_same(mod, new, (1, 3, 6, 6))
    # the inverse merges the halves again
    back = only(find_matches(new, rules=[RULES["split_conv"].inverse_of]), "merge_concat_convs")
    assert len(back) == 1
    again = apply_match(new, back[0])
    assert ops(again).count("relax.nn.conv2d") == 4 and "relax.concat" not in ops(again)
    assert_same(mod, again, (1, 3, 6, 6))
    with pytest.raises(SubstitutionError, match="split_conv"):
        apply_match(mod, Match("split_conv", m.nodes, (8, 24)), check=False)


@pytest.mark.parametrize("shape", [(2, 8), (2, 3, 8)])
def test_split_matmul(shape):
    def body(n, x):
        return relax.Tuple([_dense(n, x, 8, 40, relu=True, name="a"), _dense(n, x, 8, 20, name="b")])

    mod = build(shape, body)
    ms = only(find_matches(mod), "split_matmul")
    assert len(ms) == 1 and ms[0].nodes[0] == "a" and ms[0].params == (20, 20)
    new = apply_match(mod, ms[0])
    assert ops(new).count("relax.matmul") == 3
    assert_same(mod, new, shape)


def test_onnx_gemm_after_fold_constants():
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    from tvm_interop.passes.substitutions import fold_constants
    from tvm_interop.frontends.onnx_import import from_onnx

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal(s) * 0.3).astype("float32"), n)
             for n, s in (("W", (32, 3, 3, 3)), ("B", (32,)), ("G", (64, 32)), ("GB", (64,)))]
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["p"]),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "G", "GB"], ["y"], transB=1)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], inits)
    mod = from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))
    # unfolded: the Gemm weight is a permute_dims binding, the conv bias a reshape binding
    (m,) = find_matches(ensure_unique_names(mod), rules=["split_conv", "split_matmul"])
    assert m.rule == "split_conv" and len(m.nodes) == 1
    folded = fold_constants(mod)
    ms = find_matches(folded, rules=["split_conv", "split_matmul"])
    assert sorted((m.rule, len(m.nodes)) for m in ms) == [("split_conv", 3), ("split_matmul", 2)]
    new = folded
    for m in ms:
        new = apply_match(new, find_matches(new, rules=[m.rule])[0])
    assert_same(mod, new, (1, 3, 6, 6))


# ---------------------------------------------------------------------------------------------- the zoo
ZOO_SMALL = {
    "inception_v3": {"image_size": 75, "width": 0.125, "depth": 1},
    "nasnet_a_mobile": {"image_size": 32, "width": 0.125, "depth": 1},
    "squeezenet": {"image_size": 32, "width": 0.25},
}


@pytest.fixture(scope="module")
def zoo_matches():
    from tvm_interop.models import get_model

    out = {}
    for name, cfg in ZOO_SMALL.items():
        mod = ensure_unique_names(get_model(name, **cfg))
        out[name] = (mod, find_matches(mod))
    return out


def test_zoo_matches_found(zoo_matches):
    rules = {name: {m.rule for m in ms} for name, (_, ms) in zoo_matches.items()}
    assert {"merge_shared_input_convs", "merge_concat_convs", "split_conv", "split_matmul"} <= rules["inception_v3"]
    assert {"merge_added_convs", "split_matmul"} <= rules["nasnet_a_mobile"]
    assert {"merge_shared_input_convs", "merge_concat_convs", "split_conv"} <= rules["squeezenet"]
    for name, (mod, ms) in zoo_matches.items():
        assert len({m.key for m in ms}) == len(ms)
        nodes = {n.name for n in dataflow_nodes(mod)}
        assert all(set(m.nodes) <= nodes for m in ms), name


@pytest.mark.parametrize("name", zoo_params(sorted(ZOO_SMALL)))
def test_zoo_one_match_per_rule_keeps_outputs(name, zoo_matches):
    mod, _ = zoo_matches[name]
    new, applied = mod, []
    for rule in RULES:
        ms = find_matches(new, rules=[rule])
        if ms:
            new = apply_match(new, ms[len(ms) // 2])  # checked numerically on the region first
            applied.append(rule)
    assert len(applied) >= 2
    shape = tuple(int(d) for d in mod["main"].params[0].ty.shape)
    assert_same(mod, new, shape, tol=1e-4)


# ---------------------------------------------------------------------------------------------- rewriting
def test_rewrite_moves_region_past_independent_bindings():
    def body(n, x):
        a = n.conv(x, 4, 4, 1, bias=False, relu=False, name="a")
        y = n.bb.emit(op.nn.relu(x), name_hint="y")                  # defined after a, read by b
        b = n.conv(y, 4, 4, 3, pad=1, bias=False, relu=False, name="b")
        s = n.bb.emit(op.add(a, b), name_hint="s")
        c = n.conv(x, 4, 4, 1, name="c")
        u = n.bb.emit(op.multiply(c, c), name_hint="u")             # reads c before d exists
        d = n.conv(x, 4, 4, 3, pad=1, name="d")
        return relax.Tuple([s, u, d])

    mod = build((1, 4, 5, 5), body)
    for rule in ("merge_added_convs", "merge_shared_input_convs"):
        (m,) = find_matches(mod, rules=[rule])
        new = apply_match(mod, m)
        names = [n.name for n in dataflow_nodes(new)]
        assert {"y", "u"} <= set(names) and not set(m.nodes) & set(names)
        assert_same(mod, new, (1, 4, 5, 5))


def test_rewrite_rejects_non_convex_region():
    from tvm_interop.passes.substitutions.graph import DataflowGraph

    def body(n, x):
        a = n.bb.emit(op.nn.relu(x), name_hint="a")
        b = n.bb.emit(op.nn.relu(a), name_hint="b")
        return op.add(a, b)

    mod = build((1, 2, 3, 3), body)
    out = dataflow_nodes(mod)[-1].name
    assert not DataflowGraph(mod).is_convex({"a", out})

    def build_(em, get):
        return {out: em.emit(op.add(get("data"), get("data")), replaces=out)}

    with pytest.raises(SubstitutionError, match="my_rule.*convex"):
        rewrite_main(mod, ["a", out], build_, rule="my_rule")
    with pytest.raises(SubstitutionError, match="my_rule.*not an input"):
        rewrite_main(mod, ["b", out], lambda em, get: {out: em.emit(op.add(get("b"), get("a")), replaces=out)},
                     rule="my_rule")


# ---------------------------------------------------------------------------------------------- numpy oracle
@pytest.mark.parametrize("seed", range(6))
def test_numpy_oracle_equals_tvm_on_the_rules_operators(seed):
    """The proofs' numpy oracle computes what TVM's build computes: conv2d with random strides, asymmetric
    padding, dilation and groups, with bias, relu, split, concat and matmul after it."""
    rng = np.random.default_rng(seed)
    groups = int(rng.choice([1, 2, 4]))
    cin, cout, k = 4 * groups, 4 * groups, int(rng.choice([1, 3, 5]))
    attrs = dict(strides=tuple(int(s) for s in rng.integers(1, 3, 2)),
                 padding=tuple(int(p) for p in rng.integers(0, 3, 4)),
                 dilation=tuple(int(d) for d in rng.integers(1, 3, 2)), groups=groups)
    shape = (int(rng.integers(1, 3)), cin, int(rng.integers(9, 14)), int(rng.integers(9, 14)))
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            w = relax.const(rng.standard_normal((cout, cin // groups, k, k)).astype("float32"))
            y = bb.emit(op.nn.conv2d(x, w, **attrs))
            y = bb.emit(op.nn.relu(op.add(y, relax.const(rng.standard_normal((1, cout, 1, 1)).astype("float32")))))
            parts = bb.emit(op.split(y, [1, 3], axis=1))
            cat = bb.emit(op.concat([relax.TupleGetItem(parts, 2), relax.TupleGetItem(parts, 0)], axis=1))
            last = int(cat.ty.shape[-1])
            m = bb.emit(op.matmul(cat, relax.const(rng.standard_normal((last, 3)).astype("float32"))))
            out = bb.emit_output(relax.Tuple([m, y]))
        bb.emit_func_output(out)
    mod = bb.get()
    xi = rng.standard_normal(shape).astype("float32")
    for got, ref in zip(evaluate(mod, [xi]), _run_tvm(mod, [xi])):
        assert got.shape == ref.shape
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_numpy_oracle_refuses_what_it_does_not_implement():
    """An operator outside the rules' set is not guessed at: the proof falls back to TVM's build."""
    mod = build((1, 4, 6, 6), lambda n, x: op.nn.max_pool2d(n.conv(x, 4, 4, 3, pad=1), pool_size=2))
    with pytest.raises(Unsupported, match="max_pool2d"):
        evaluate(mod, [np.zeros((1, 4, 6, 6), "float32")])
    import tvm_interop.passes.substitutions.check as chk

    xi = np.random.default_rng(0).standard_normal((1, 4, 6, 6)).astype("float32")
    np.testing.assert_allclose(chk._run(mod, [xi])[0], _run_tvm(mod, [xi])[0], rtol=1e-6, atol=1e-6)
