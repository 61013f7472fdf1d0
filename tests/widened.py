"""Catalog spaces with every strategy dimension widened: the rows the tier tests sweep."""

from __future__ import annotations

import functools

from paraspace.explorer.evaluate import pack
from paraspace.spaces import catalog
from paraspace.spaces.catalog import LoadedSpace
from paraspace.spaces.encode import DIMENSIONS, Encoder
from paraspace.spaces.enums import labels
from paraspace.spaces.schema import SpaceSpec, validate

SPACES = tuple(catalog.names("space"))
#: every dimension's values in the widened spaces: every enum label and flag, a few sizes
WIDE = {"tp": [1, 2, 4, 8], "pp": [1, 2, 3, 4, 8, 16], "cp": [1, 2], "vpp": [1, 2, 3], "micro_batch": [1, 2],
        "recompute_layers": [0, 2], "zero": [0, 1, 2, 3], "ep": [1, 2, 8, 16, 64], "expert_tp": [1, 2]}
MOE_ONLY = ("ep", "expert_tp", "ep_placement", "dispatch", "tbo")


@functools.cache
def wide(name: str) -> tuple[Encoder, object]:
    """A catalog space's model, hardware and workload with every strategy dimension widened."""
    space = catalog.load_space(name)
    dims = {}
    for dim in DIMENSIONS:
        if dim.name in ("devices", "dp") or (space.model.moe is None and dim.name in MOE_ONLY):
            continue  # devices: the space's first; dp derived; a dense model's expert dimensions at their defaults
        dims[dim.name] = (labels(dim.enum) if dim.enum is not None else [False, True] if dim.boolean
                          else WIDE[dim.name])
    raw = {**space.raw, "devices": space.spec.device_counts[0], "dimensions": dims}
    widened = LoadedSpace(spec=validate(SpaceSpec, raw, space.source), model=space.model, hardware=space.hardware,
                          source=space.source, raw=raw)
    return Encoder(widened), pack(widened)
