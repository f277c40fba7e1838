"""Reading a JSON file the user handed us, with one clear error for a missing or unreadable file and one for a
file that is not JSON (instead of a traceback from ``open`` or ``json``)."""
from __future__ import annotations

import json

from .errors import InteropError


def read_json(path: str, label: str | None = None, error: type[Exception] = InteropError):
    """The parsed content of ``path``; ``label`` names the file in errors (default: the path itself)."""
    label = label or str(path)
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as e:
        raise error(f"cannot read {label}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise error(f"{label} is not valid JSON: {e}") from None
