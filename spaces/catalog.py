"""The shipped catalog and user files: load by catalog name or by path.

Catalog files live in ``spaces/catalog/{hardware,models,spaces}/NAME.toml``;
anywhere a name is accepted, a path to a TOML file of the same shape works
too (``--model ./my-model.toml``, ``model = "../models/x.toml"`` inside a
space file, resolved relative to that file).
"""

from __future__ import annotations

import hashlib
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from paraspace.spaces.errors import CatalogError
from paraspace.spaces.schema import Hardware, Model, Record, SpaceSpec, validate

CATALOG_DIR = Path(__file__).parent / "catalog"

#: kind -> (folder, record type)
KINDS: dict[str, tuple[str, type[Record]]] = {
    "hardware": ("hardware", Hardware),
    "model": ("models", Model),
    "space": ("spaces", SpaceSpec),
}

R = TypeVar("R", bound=Record)


def names(kind: str) -> list[str]:
    """Catalog names of one kind, sorted."""
    folder, _ = KINDS[kind]
    return sorted(p.stem for p in (CATALOG_DIR / folder).glob("*.toml"))


def resolve(kind: str, ref: str, *, relative_to: Path | None = None, source: str = "command line") -> Path:
    """The file behind a catalog name or a path; ``source`` names the referrer in errors."""
    folder, _ = KINDS[kind]
    as_path = Path(ref)
    if relative_to is not None and not as_path.is_absolute():
        as_path = relative_to / as_path
    if ref.endswith(".toml") or as_path.exists():
        if not as_path.is_file():
            raise CatalogError(source, kind, ref, "an existing TOML file")
        return as_path
    candidate = CATALOG_DIR / folder / f"{ref}.toml"
    if not candidate.is_file():
        raise CatalogError(source, kind, ref, f"a {kind} TOML path or one of {names(kind)}")
    return candidate


def read_toml(path: Path) -> dict[str, Any]:
    """A TOML file's tables; a ``CatalogError`` naming the file when it cannot be
    read, is not UTF-8 (TOML's encoding) or is not TOML."""
    try:
        data = path.read_bytes()
    except OSError as err:
        raise CatalogError(path, "(file)", path.name, f"a readable file ({err.strerror})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise CatalogError(path, "(file)", path.name,
                           f"UTF-8 text (byte {err.start} on line {line} is {data[err.start:err.start + 1]!r})") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise CatalogError(path, "(file)", path.name, f"valid TOML ({err})") from None


def read_with_extends(kind: str, path: Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """A file's TOML with ``extends = "BASE"`` applied: the base's tables merged
    key by key, anything else (values, arrays such as ``links``) replaced."""
    raw = read_toml(path)
    base_ref = raw.pop("extends", None)
    if base_ref is None:
        return raw
    if not isinstance(base_ref, str):
        raise CatalogError(path, "extends", base_ref, f"the name or path of a {kind} to extend")
    base_path = resolve(kind, base_ref, relative_to=None if _is_name(base_ref) else path.parent, source=str(path))
    if base_path.resolve() in seen:
        raise CatalogError(path, "extends", base_ref, "no cycle of extends")
    return _merge(read_with_extends(kind, base_path, (*seen, path.resolve())), raw)


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def load(kind: str, ref: str, *, relative_to: Path | None = None, source: str = "command line") -> Any:
    """Load and validate a catalog record of ``kind`` by name or path."""
    path = resolve(kind, ref, relative_to=relative_to, source=source)
    _, record = KINDS[kind]
    return validate(record, read_with_extends(kind, path), str(path))


def load_hardware(ref: str, *, relative_to: Path | None = None, source: str = "command line") -> Hardware:
    return load("hardware", ref, relative_to=relative_to, source=source)


def load_model(ref: str, *, relative_to: Path | None = None, source: str = "command line") -> Model:
    return load("model", ref, relative_to=relative_to, source=source)


@dataclass(frozen=True)
class LoadedSpace:
    """A space file with its model and hardware resolved."""

    spec: SpaceSpec
    model: Model
    hardware: Hardware
    source: str
    #: the TOML as written, kept for provenance in output metadata
    raw: dict[str, Any]


def load_space(ref: str, overrides: dict[str, Any] | None = None) -> LoadedSpace:
    """A space by catalog name or path; ``overrides`` replace top-level keys
    (model, hardware, devices, ...) as given on the command line, where paths
    are relative to the working directory rather than to the space file."""
    path = resolve("space", ref)
    raw = read_toml(path)
    source = str(path)
    if overrides:
        raw = {**raw, **{k: _absolute(v) for k, v in overrides.items()}}
        source += f" (with command-line {', '.join(sorted(overrides))})"
    return space_from_raw(raw, source, path.parent)


def space_from_raw(raw: dict[str, Any], source: str, base_dir: Path) -> LoadedSpace:
    """Validate a space given as a TOML-shaped dict; model/hardware paths resolve against ``base_dir``."""
    spec = validate(SpaceSpec, raw, source)
    model = load_model(spec.model, relative_to=None if _is_name(spec.model) else base_dir, source=source)
    hardware = load_hardware(spec.hardware, relative_to=None if _is_name(spec.hardware) else base_dir, source=source)
    if spec.node_devices is not None:
        hardware = hardware.with_node_devices(spec.node_devices, f"{source}: node_devices")
    return LoadedSpace(spec=spec, model=model, hardware=hardware, source=source, raw=raw)


def _absolute(value: Any) -> Any:
    if isinstance(value, str) and not _is_name(value):
        return str(Path(value).resolve())
    return value


def _is_name(ref: str) -> bool:
    return not ref.endswith(".toml") and "/" not in ref


def catalog_hash() -> str:
    """SHA-256 over every shipped catalog file (names and bytes), for provenance."""
    digest = hashlib.sha256()
    for path in sorted(CATALOG_DIR.rglob("*.toml")):
        digest.update(str(path.relative_to(CATALOG_DIR)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def describe() -> dict[str, list[tuple[str, str]]]:
    """Every shipped entry with its one-line description, by kind."""
    return {kind: [(n, load(kind, n).description) for n in names(kind)] for kind in KINDS}
