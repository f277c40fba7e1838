"""``tvm-interop run`` with real inputs and outputs: .npy / .npz files, checked against the model's signature."""
from __future__ import annotations

import json

import numpy as np
import pytest

from tvm_interop.cli import main


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli_io")
    so = d / "m.so"
    assert main(["compile", "squeezenet", "--width", "0.125", "--image-size", "32", "--scheduler", "greedy",
                 "--guard", "off", "-o", str(so), "--quiet"]) == 0
    return d, so


def _reference(so, x):
    from tvm_interop import runtime
    m = runtime.load(str(so))
    try:
        out = m.run(x)
        return (out[0] if isinstance(out, list) else out), m.inputs
    finally:
        m.close()


def test_run_with_npy_and_npz_inputs_writes_the_models_outputs(library, capsys):
    import tvm_interop
    from tvm_interop.models import get_model

    d, so = library
    x = np.random.default_rng(3).standard_normal((1, 3, 32, 32)).astype("float32")
    ref, sig = _reference(so, x)
    plain = tvm_interop.run_reference(get_model("squeezenet", width=0.125, image_size=32), [x])
    np.testing.assert_allclose(ref, plain, rtol=1e-4, atol=1e-4)
    np.save(d / "x.npy", x)
    assert main(["run", str(so), "--input", str(d / "x.npy"), "--output", str(d / "y.npy"), "--repeat", "2",
                 "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["inputs"] == str(d / "x.npy") and info["output"] == str(d / "y.npy")
    np.testing.assert_allclose(np.load(d / "y.npy"), ref, rtol=1e-5, atol=1e-6)
    # .npz by input name, and positional; .npz output
    np.savez(d / "named.npz", **{sig[0]["name"]: x})
    np.savez(d / "positional.npz", x)
    for f in ("named.npz", "positional.npz"):
        assert main(["run", str(so), "--input", str(d / f), "--output", str(d / "y.npz"), "--repeat", "1"]) == 0
        assert "wrote 1 output(s)" in capsys.readouterr().out
        with np.load(d / "y.npz") as z:
            assert z.files == ["output_0"]
            np.testing.assert_allclose(z["output_0"], ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("make,match", [
    (lambda d: np.save(d / "bad.npy", np.zeros((1, 3, 16, 16), "float32")),
     r"input '.*' must be \(1, 3, 32, 32\) float32; .*bad.npy holds \(1, 3, 16, 16\) float32"),
    (lambda d: np.save(d / "bad.npy", np.zeros((1, 3, 32, 32), "float64")), r"must be \(1, 3, 32, 32\) float32.*float64"),
    (lambda d: None, r"input file .*bad.npy' does not exist"),
    (lambda d: (d / "bad.npy").write_text("not numpy"), r"cannot read input file"),
])
def test_bad_inputs_name_the_expected_shape(library, capsys, make, match):
    d, so = library
    (d / "bad.npy").unlink(missing_ok=True)
    make(d)
    assert main(["run", str(so), "--input", str(d / "bad.npy"), "--repeat", "1"]) == 1
    import re

    assert re.search(match, capsys.readouterr().err), match


def test_wrong_input_count_and_bad_output_paths(library, capsys):
    d, so = library
    x = np.zeros((1, 3, 32, 32), "float32")
    np.save(d / "a.npy", x)
    assert main(["run", str(so), "--input", f"{d / 'a.npy'},{d / 'a.npy'}", "--repeat", "1"]) == 1
    assert "takes 1 input(s)" in capsys.readouterr().err
    np.savez(d / "odd.npz", foo=x)
    assert main(["run", str(so), "--input", str(d / "odd.npz"), "--repeat", "1"]) == 1
    assert "holds ['foo']" in capsys.readouterr().err
    assert main(["run", str(so), "--input", str(d / "a.npy"), "--output", str(d / "y.txt"), "--repeat", "1"]) == 1
    assert "must end in .npy or .npz" in capsys.readouterr().err
    assert not (d / "y.txt").exists()
