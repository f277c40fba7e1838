"""Keep TVM's stray debug lines out of the user's terminal when a VM executable is saved or loaded.

Why: TVM 0.27 (and its main branch, ``src/runtime/vm/executable.cc``) logs ``LOG(WARNING) << "Scope Saving:"`` for
every memory-scope entry when it saves a Relax VM executable, and ``"Scope Loaded:"`` when it loads one. They are
leftover debug output, not warnings: exporting the demo's Inception-v3 printed 190 of them and nothing else. They
are written by TVM's C++ logger straight to file descriptor 2, so Python's ``warnings`` / ``logging`` filters cannot
reach them. :func:`quiet_scope_lines` redirects descriptor 2 into a temporary file for the duration of the save or
load and writes back every line except those, in order, when the block ends (also when it raises), so a real TVM
warning or error message is never lost, only delayed to the end of the block.
"""
from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from typing import Iterator

# "[03:51:04] /project/src/runtime/vm/executable.cc:276: Warning: Scope Saving:" (the scope may follow the colon)
SCOPE_LINE = re.compile(rb"^\[[0-9:]+\] \S*executable\.cc:\d+: Warning: Scope (Saving|Loaded):\S*\s*$")


def drop_scope_lines(text: bytes) -> bytes:
    """``text`` without TVM's ``Scope Saving:`` / ``Scope Loaded:`` debug lines."""
    return b"".join(line for line in text.splitlines(keepends=True) if not SCOPE_LINE.match(line))


@contextlib.contextmanager
def quiet_scope_lines() -> Iterator[None]:
    """Run the block with descriptor 2 captured; write back what TVM and anyone else wrote to it, minus the scope
    debug lines. Does nothing when descriptor 2 cannot be duplicated (a closed or unusual stderr)."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):
        yield
        return
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            try:
                sys.stderr.flush()
            except (OSError, ValueError, AttributeError):
                pass
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            rest = drop_scope_lines(sink.read())
            if rest:
                os.write(2, rest)
