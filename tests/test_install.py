"""paraspace installs under one package and beside other ML packages (issue 16.12)."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

#: top-level import names other packages own (Hugging Face's kernels and spaces)
FOREIGN = ("kernels", "spaces", "results", "explorer")


def test_the_distribution_writes_nothing_outside_paraspace(tmp_path):
    """Every Python file of the installed distribution lies under ``paraspace/`` (an
    editable install lists its path hook instead). Read from another folder: a source
    checkout's own ``paraspace.egg-info`` lists the repository's folders."""
    code = ("import importlib.metadata as m; from pathlib import Path; "
            "print(' '.join(sorted({Path(str(f)).parts[0] for f in m.files('paraspace') or [] "
            "if str(f).endswith('.py')})))")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    tops = set(out.stdout.split())
    assert tops and not tops & set(FOREIGN), sorted(tops)


def test_hugging_face_kernels_and_paraspace_import_side_by_side(tmp_path):
    """Run from a folder that is not this checkout (whose kernels/ folder would shadow
    any installed package): Hugging Face's ``kernels`` is its own package, and
    ``paraspace.kernels`` is ours."""
    try:
        dist = importlib.metadata.distribution("kernels")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("Hugging Face's kernels is not installed (pip install '.[test]' installs it)")
    code = ("import kernels, paraspace.kernels, paraspace.kernels.jit; "
            "print(kernels.__file__); print(paraspace.kernels.__file__); print(hasattr(kernels, 'get_kernel'))")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    hf_file, ours, has_api = out.stdout.split()
    assert Path(hf_file).parent.name == "kernels" and "paraspace" not in Path(hf_file).parts
    assert has_api == "True" and dist.metadata["Name"] == "kernels"
    assert Path(ours).name == "__init__.py" and Path(ours).resolve() != Path(hf_file).resolve()
