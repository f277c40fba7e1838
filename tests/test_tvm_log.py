"""TVM's per-scope debug lines are kept out of the terminal on export and load; every other line still arrives."""
from __future__ import annotations

import os

import pytest

from tvm_interop.runtime.tvm_log import SCOPE_LINE, drop_scope_lines, quiet_scope_lines

# what TVM 0.27 writes to descriptor 2 (src/runtime/vm/executable.cc), once per memory-scope entry
SAVING = b"[03:51:04] /project/src/runtime/vm/executable.cc:276: Warning: Scope Saving:\n"
LOADED = b"[03:47:34] /project/src/runtime/vm/executable.cc:340: Warning: Scope Loaded:global\n"
REAL = b"[03:51:05] /project/src/runtime/vm/executable.cc:99: Warning: something that matters\n"


def test_only_the_scope_lines_are_dropped():
    assert SCOPE_LINE.match(SAVING.rstrip(b"\n")) and SCOPE_LINE.match(LOADED)
    text = SAVING * 3 + REAL + LOADED + b"Scope Saving: in a sentence of someone else\n" + b"no newline at the end"
    assert drop_scope_lines(text) == REAL + b"Scope Saving: in a sentence of someone else\n" + b"no newline at the end"


def test_descriptor_two_is_filtered_and_restored(capfd):
    with quiet_scope_lines():
        os.write(2, SAVING * 190)
        os.write(2, REAL)
        os.write(2, LOADED)
    os.write(2, b"after\n")
    assert capfd.readouterr().err.encode() == REAL + b"after\n"


def test_lines_written_before_an_error_still_arrive(capfd):
    with pytest.raises(RuntimeError, match="boom"):
        with quiet_scope_lines():
            os.write(2, SAVING + REAL)
            raise RuntimeError("boom")
    assert capfd.readouterr().err.encode() == REAL


def test_export_and_load_go_through_the_filter(tmp_path, capfd):
    """runtime.model.export_library (what CompiledModel.export and every bundle use) filters what the library's own
    export writes to descriptor 2, and the file still lands atomically."""
    from tvm_interop.runtime.model import export_library

    class Library:
        def export_library(self, path, **_):
            os.write(2, SAVING * 5 + REAL)
            with open(path, "wb") as f:
                f.write(b"library bytes")

    export_library(Library(), str(tmp_path / "m.so"))
    assert (tmp_path / "m.so").read_bytes() == b"library bytes"
    assert capfd.readouterr().err.encode() == REAL
