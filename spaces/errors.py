"""The one error type for bad catalog or user input."""

from __future__ import annotations

from pathlib import Path
from typing import Any


class CatalogError(ValueError):
    """A catalog or user file (or command-line value) that cannot be used.

    The message always names where the input came from, the field, the value
    and what was expected, e.g.
    ``models/x.toml: heads = 0: expected a value greater than 0``.
    """

    def __init__(self, source: str | Path, field: str, value: Any, expected: str) -> None:
        self.source = str(source)
        self.field = field
        self.value = value
        self.expected = expected
        shown = "(missing)" if value is _MISSING else repr(value)
        super().__init__(f"{self.source}: {field} = {shown}: expected {expected}")


class _Missing:
    def __repr__(self) -> str:
        return "(missing)"


#: Stands for a required field that is absent.
_MISSING = _Missing()
MISSING: Any = _MISSING
