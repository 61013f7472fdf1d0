"""The package layering of docs/architecture (``shared/design/architecture.md``), read from
the import statements themselves (``ast``): ``spaces`` never imports ``kernels`` (nor
numba, which it would only need for kernels), and ``kernels`` never imports ``explorer``
or ``results``. Data flows one way."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: package -> the top-level modules and paraspace packages its files may not import
FORBIDDEN = {
    "spaces": ("numba", "paraspace.kernels", "paraspace.explorer", "paraspace.results"),
    "kernels": ("paraspace.explorer", "paraspace.results"),
}


def imported_modules(path: Path, package: str) -> list[tuple[int, str]]:
    """Every module a file imports, absolute (relative imports resolved against
    ``paraspace.<package>``), with its line."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                here = ["paraspace", package, *path.relative_to(ROOT / package).parent.parts]
                base = here[:len(here) - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            out.append((node.lineno, module))
            # "from paraspace import kernels" imports paraspace.kernels
            out += [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
    return out


def breaches(package: str) -> list[str]:
    """``file:line imports module`` for each import statement that breaks the layering."""
    found: dict[str, str] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        for line, module in imported_modules(path, package):
            if any(module == bad or module.startswith(bad + ".") for bad in FORBIDDEN[package]):
                found.setdefault(f"{path.relative_to(ROOT)}:{line}", module)
    return [f"{where} imports {module}" for where, module in found.items()]


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_keeps_to_its_layer(package):
    assert breaches(package) == []


def test_the_check_sees_each_form_of_import(tmp_path, monkeypatch):
    """The checker itself: plain, from, aliased and relative imports are all caught."""
    pkg = tmp_path / "spaces"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "a.py").write_text("import numba.core as nc\n")
    (pkg / "b.py").write_text("from paraspace import kernels\n")
    (pkg / "c.py").write_text("from ..kernels.jit import jit\n")
    (pkg / "sub" / "d.py").write_text("def f():\n    from ...kernels import jit\n")
    (pkg / "e.py").write_text("import numpy as np\nfrom paraspace.spaces.enums import Reason\n")
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    assert [b.split(" imports ")[0] for b in breaches("spaces")] == [
        "spaces/a.py:1", "spaces/b.py:1", "spaces/c.py:1", "spaces/sub/d.py:2"]
