"""The TOML catalog: every shipped entry loads, ``extends`` merges, and every
way a catalog or user file can be wrong gives a ``CatalogError`` whose message
names the file, the field, the value and what was expected."""

from __future__ import annotations

from pathlib import Path

import pytest

from paraspace.spaces import catalog
from paraspace.spaces.catalog import load_hardware, load_model, load_space, space_from_raw
from paraspace.spaces.encode import Encoder, check_space
from paraspace.spaces.enums import Reason
from paraspace.spaces.errors import CatalogError
from paraspace.spaces.schema import GIB, Hardware, Model, SpaceSpec

HARDWARE = catalog.names("hardware")
MODELS = catalog.names("model")
SPACES = catalog.names("space")

H100 = catalog.CATALOG_DIR / "hardware" / "h100-sxm5-80gb.toml"


# --------------------------------------------------------------------------- helpers


def toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return repr(value)


def write_toml(path: Path, data: dict) -> str:
    """A flat dict (plus one level of tables) as TOML; returns the path as a string."""
    lines = [f"{k} = {toml_value(v)}" for k, v in data.items() if not isinstance(v, dict)]
    for key, table in data.items():
        if isinstance(table, dict):
            lines.append(f"\n[{key}]")
            lines += [f"{k} = {toml_value(v)}" for k, v in table.items()]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


MODEL = dict(
    name="tiny",
    description="a tiny test model",
    layers=4,
    hidden=256,
    heads=8,
    kv_heads=2,
    ffn=1024,
    vocab=1000,
    glu=True,
)

SPACE = dict(
    name="user-space",
    description="a user space",
    model="llama3-8b",
    hardware="h100-sxm5-80gb",
    devices=8,
    global_batch=16,
    seq_len=4096,
)


def model_error(tmp_path: Path, **changes) -> tuple[CatalogError, str]:
    data = {**MODEL, **changes}
    data = {k: v for k, v in data.items() if v is not None}
    path = write_toml(tmp_path / "model.toml", data)
    with pytest.raises(CatalogError) as info:
        load_model(path)
    return info.value, path


def hardware_error(tmp_path: Path, text: str) -> tuple[CatalogError, str]:
    path = tmp_path / "hardware.toml"
    path.write_text(text)
    with pytest.raises(CatalogError) as info:
        load_hardware(str(path))
    return info.value, str(path)


def h100_with(old: str, new: str) -> str:
    """The shipped H100 file with one exact line replaced."""
    text = H100.read_text()
    assert text.count(old) == 1, old
    return text.replace(old, new)


def space_error(tmp_path: Path, **changes) -> CatalogError:
    """The error of a space given as a dict (validation or encoder construction)."""
    raw = {**SPACE, **changes}
    with pytest.raises(CatalogError) as info:
        Encoder(space_from_raw(raw, "spaces/user.toml", tmp_path))
    return info.value


def assert_message(err: CatalogError, *parts: str) -> None:
    msg = str(err)
    for part in parts:
        assert part in msg, f"{part!r} not in {msg!r}"


# --------------------------------------------------------------------------- shipped catalog


@pytest.mark.parametrize("name", HARDWARE)
def test_every_hardware_loads(name):
    hw = load_hardware(name)
    assert isinstance(hw, Hardware)
    assert hw.name == name
    assert hw.links[-1].domain_devices is None
    assert hw.device.hbm_capacity_bytes > 0
    assert "bf16" in hw.device.peak_TFLOP_per_s


@pytest.mark.parametrize("name", MODELS)
def test_every_model_loads(name):
    model = load_model(name)
    assert isinstance(model, Model)
    assert model.name == name
    assert model.heads % model.kv_heads == 0
    if model.mla is None and model.name != "qwen3-235b-a22b":  # Qwen3: 64 heads of 128 on a 4096 model
        assert model.d_head * model.heads == model.hidden


@pytest.mark.parametrize("name", SPACES)
def test_every_space_loads_and_has_candidates(name):
    space = load_space(name)
    assert isinstance(space.spec, SpaceSpec)
    assert space.spec.name == name
    assert space.source.endswith(f"{name}.toml")
    assert space.model.name == space.spec.model
    assert space.hardware.name == space.spec.hardware
    encoded = Encoder(space).encode_all()
    assert encoded.n_rows > 0
    assert int(encoded.first_reason.sum()) == encoded.n_combinations


def test_catalog_is_not_empty():
    assert len(HARDWARE) >= 5 and len(MODELS) >= 5 and len(SPACES) >= 3
    assert "llama3-70b-h100-1024" in SPACES


@pytest.mark.parametrize("kind", ["hardware", "model"])
def test_one_line_descriptions_hardware_models(kind):
    for name in catalog.names(kind):
        text = catalog.load(kind, name).description
        assert text.strip() and "\n" not in text


@pytest.mark.parametrize("name", SPACES)
def test_one_line_descriptions_spaces(name):
    text = load_space(name).spec.description
    assert text.strip() and "\n" not in text


def test_describe():
    described = catalog.describe()
    assert set(described) == {"hardware", "model", "space"}
    for kind, entries in described.items():
        assert [n for n, _ in entries] == catalog.names(kind)
        for _, text in entries:
            assert text.strip() and "\n" not in text


def test_extends_h800_inherits_h100_device_with_own_nvlink():
    h100, h800 = load_hardware("h100-sxm5-80gb"), load_hardware("h800-sxm5-80gb")
    assert h800.name == "h800-sxm5-80gb"
    assert h800.device == h100.device
    assert h800.links[0].name == "nvlink"
    assert h800.links[0].bandwidth_GB_per_s == 200.0
    assert h100.links[0].bandwidth_GB_per_s == 450.0
    assert h800.links[1] == h100.links[1]


def test_extends_a100_40gb_merges_device_table():
    a80, a40 = load_hardware("a100-sxm4-80gb"), load_hardware("a100-sxm4-40gb")
    assert a40.device.hbm_capacity_GiB == 40.0
    assert a40.device.hbm_capacity_bytes == 40 * GIB
    assert a40.device.hbm_bandwidth_GB_per_s == 1555.0
    # everything else in [device] comes from the base, key by key
    assert a40.device.peak_TFLOP_per_s == a80.device.peak_TFLOP_per_s
    assert a40.device.compute_units == a80.device.compute_units == 108
    assert a40.links == a80.links
    assert a40.description != a80.description


def test_extends_user_file_from_catalog_name(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text('extends = "h100-sxm5-80gb"\nname = "mine"\n\n[device]\nhbm_capacity_GiB = 96.0\n')
    hw = load_hardware(str(path))
    assert hw.name == "mine"
    assert hw.device.hbm_capacity_GiB == 96.0
    assert hw.device.compute_units == 132
    assert hw.links == load_hardware("h100-sxm5-80gb").links


def test_extends_relative_path_chain(tmp_path):
    (tmp_path / "base.toml").write_text('extends = "h100-sxm5-80gb"\nname = "base"\n')
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "leaf.toml").write_text('extends = "../base.toml"\nname = "leaf"\n[device]\ncompute_units = 100\n')
    hw = load_hardware(str(tmp_path / "sub" / "leaf.toml"))
    assert hw.name == "leaf" and hw.device.compute_units == 100
    assert hw.description == load_hardware("h100-sxm5-80gb").description


def test_user_model_by_path_from_space_file(tmp_path):
    write_toml(tmp_path / "tiny.toml", MODEL)
    space_path = write_toml(tmp_path / "space.toml", {**SPACE, "model": "tiny.toml"})
    space = load_space(space_path)
    assert space.model.name == "tiny"
    assert space.source == space_path


def test_space_overrides(tmp_path):
    space = load_space("llama3-8b-h100-64", {"devices": 8})
    assert space.spec.devices == 8
    assert "command-line devices" in space.source
    assert space.source.startswith(str(catalog.CATALOG_DIR / "spaces" / "llama3-8b-h100-64.toml"))


# --------------------------------------------------------------------------- unknown keys


def test_unknown_key_top_level(tmp_path):
    err, path = model_error(tmp_path, activation="gelu")
    assert_message(err, path, "activation", "'gelu'", "known keys", "'layers'", "'kv_heads'")
    assert err.source == path and err.field == "activation" and err.value == "gelu"


def test_unknown_key_nested_in_table(tmp_path):
    text = '[device]\nhbm_capcity_GiB = 96.0\n'
    err, path = hardware_error(tmp_path, 'extends = "h100-sxm5-80gb"\n' + text)
    assert_message(err, path, "device.hbm_capcity_GiB", "96.0", "known keys", "'hbm_capacity_GiB'", "'compute_units'")
    assert "'bandwidth_GB_per_s'" not in str(err)  # the keys of [device], not of [[links]]


def test_unknown_key_misspelt_required_key(tmp_path):
    text = h100_with("hbm_capacity_GiB = 80.0", "hbm_capcity_GiB = 80.0")
    err, path = hardware_error(tmp_path, text)
    assert_message(err, path, "device.hbm_capcity_GiB", "80.0", "known keys", "'hbm_capacity_GiB'")


def test_unknown_key_in_links_entry(tmp_path):
    text = h100_with("latency_us = 3.0", "latency_us = 3.0\nlatency_ns = 3000")
    err, path = hardware_error(tmp_path, text)
    assert_message(err, path, "links.0.latency_ns", "3000", "'latency_us'", "'domain_devices'", "'shared_by'")
    assert "'hbm_capacity_GiB'" not in str(err)


def test_unknown_key_in_space_dimensions(tmp_path):
    err = space_error(tmp_path, dimensions={"pp_size": [1, 2]})
    assert_message(err, "spaces/user.toml", "dimensions.pp_size", "1", "2", "known keys", "'tp'", "'micro_batch'")


def test_unknown_key_in_space_file(tmp_path):
    path = write_toml(tmp_path / "space.toml", {**SPACE, "devcies": 8})
    with pytest.raises(CatalogError) as info:
        load_space(path)
    assert_message(info.value, path, "devcies", "8", "known keys", "'devices'", "'global_batch'")


# --------------------------------------------------------------------------- wrong types


def test_string_for_int(tmp_path):
    err, path = model_error(tmp_path, layers="32")
    assert_message(err, path, "layers", "'32'", "expected", "integer")


def test_float_for_int(tmp_path):
    err, path = hardware_error(tmp_path, h100_with("compute_units = 132", "compute_units = 132.5"))
    assert_message(err, path, "device.compute_units", "132.5", "integer")


def test_int_for_bool(tmp_path):
    err, path = model_error(tmp_path, glu=1)
    assert_message(err, path, "glu", "= 1", "boolean")


def test_bool_for_float(tmp_path):
    err, path = hardware_error(tmp_path, h100_with("memory_efficiency = 0.80", "memory_efficiency = true"))
    assert_message(err, path, "device.memory_efficiency", "True", "number")


def test_string_for_int_in_links(tmp_path):
    err, path = hardware_error(tmp_path, h100_with("domain_devices = 8", 'domain_devices = "8"'))
    assert_message(err, path, "links.0.domain_devices", "'8'", "integer")


def test_wrong_type_in_space(tmp_path):
    err = space_error(tmp_path, devices="8")
    assert_message(err, "spaces/user.toml", "devices", "'8'", "integer")
    err = space_error(tmp_path, dimensions={"sequence_parallel": [1]})
    assert_message(err, "spaces/user.toml", "dimensions.sequence_parallel", "1", "boolean")
    err = space_error(tmp_path, dimensions={"dp": "all"})
    assert_message(err, "spaces/user.toml", "dimensions.dp", "'all'", "tuple")


# --------------------------------------------------------------------------- out of range


def test_heads_zero(tmp_path):
    err, path = model_error(tmp_path, heads=0)
    assert_message(err, path, "heads = 0", "greater than 0")
    assert err.field == "heads" and err.value == 0


def test_hbm_capacity_negative(tmp_path):
    err, path = hardware_error(tmp_path, h100_with("hbm_capacity_GiB = 80.0", "hbm_capacity_GiB = -1"))
    assert_message(err, path, "device.hbm_capacity_GiB", "-1", "greater than 0")


def test_bandwidth_zero(tmp_path):
    err, path = hardware_error(tmp_path, h100_with("bandwidth_GB_per_s = 450.0", "bandwidth_GB_per_s = 0"))
    assert_message(err, path, "links.0.bandwidth_GB_per_s = 0: expected greater than or equal to 0.001")


def test_link_efficiency_above_one(tmp_path):
    text = h100_with("# nccl-tests all-reduce busbw about 360-370 GB/s on 8x H100\nefficiency = 0.80", "efficiency = 1.5")
    err, path = hardware_error(tmp_path, text)
    assert_message(err, path, "links.0.efficiency", "1.5", "less than or equal to 1")


def test_device_efficiency_above_one(tmp_path):
    err, path = hardware_error(tmp_path, h100_with("gemm_max_efficiency = 0.65", "gemm_max_efficiency = 1.01"))
    assert_message(err, path, "device.gemm_max_efficiency", "1.01", "less than or equal to 1")


def test_gemm_tile_zero(tmp_path):
    err, path = hardware_error(tmp_path, h100_with("gemm_tiles = [[128, 128]", "gemm_tiles = [[0, 128]"))
    assert_message(err, path, "device.gemm_tiles.0.0", "0", "greater than 0")


def test_space_devices_zero(tmp_path):
    err = space_error(tmp_path, devices=0)
    assert_message(err, "spaces/user.toml", "devices = 0", "greater than 0")


# --------------------------------------------------------------------------- missing, cross-field


def test_missing_required_field(tmp_path):
    err, path = model_error(tmp_path, vocab=None)
    assert_message(err, path, "vocab", "(missing)", "required")


def test_missing_required_nested_field(tmp_path):
    err, path = hardware_error(tmp_path, h100_with("compute_units = 132\n", ""))
    assert_message(err, path, "device.compute_units", "(missing)", "required")


def test_missing_required_space_field(tmp_path):
    raw = {k: v for k, v in SPACE.items() if k != "seq_len"}
    with pytest.raises(CatalogError) as info:
        space_from_raw(raw, "spaces/user.toml", tmp_path)
    assert_message(info.value, "spaces/user.toml", "seq_len", "(missing)", "required")


def test_kv_heads_not_dividing_heads(tmp_path):
    err, path = model_error(tmp_path, kv_heads=3)
    assert_message(err, path, "kv_heads = 3", "expected a divisor of heads = 8")
    assert err.field == "kv_heads" and err.value == 3


def test_hidden_not_multiple_of_heads_without_head_dim(tmp_path):
    err, path = model_error(tmp_path, hidden=260)
    assert_message(err, path, "head_dim", "hidden = 260", "heads = 8")
    # with head_dim given it is fine
    write_toml(tmp_path / "ok.toml", {**MODEL, "hidden": 260, "head_dim": 32})
    assert load_model(str(tmp_path / "ok.toml")).d_head == 32


def test_unknown_precision_key(tmp_path):
    err, path = hardware_error(tmp_path, h100_with("fp32 = 66.9", "fp2 = 66.9"))
    assert_message(err, path, "device.peak_TFLOP_per_s.fp2", "66.9", "a precision named one of", "'bf16'", "'fp8'")


def _links(*tiers: dict) -> str:
    out = ['extends = "h100-sxm5-80gb"', 'name = "x"']
    for tier in tiers:
        out.append("[[links]]")
        out += [f"{k} = {toml_value(v)}" for k, v in tier.items()]
    return "\n".join(out) + "\n"


def _tier(name: str, domain: int | None = None, **more) -> dict:
    tier = {"name": name, "bandwidth_GB_per_s": 10.0, "latency_us": 1.0, **more}
    if domain is not None:
        tier["domain_devices"] = domain
    return tier


def test_link_tiers_not_nesting(tmp_path):
    err, path = hardware_error(tmp_path, _links(_tier("a", 8), _tier("b", 12), _tier("c")))
    assert_message(err, path, "links.1.domain_devices = 12", "whole multiple (> 1) of the inner tier's 8")


def test_link_tiers_not_growing(tmp_path):
    err, path = hardware_error(tmp_path, _links(_tier("a", 8), _tier("b", 8), _tier("c")))
    assert_message(err, path, "links.1.domain_devices = 8", "whole multiple (> 1) of the inner tier's 8")


def test_link_tiers_with_one_name(tmp_path):
    """calibrate and the messages name a tier: two called "nvlink" were accepted and
    ``calibrate comm --tier nvlink`` fitted the first without a word."""
    err, path = hardware_error(tmp_path, _links(_tier("nvlink", 8), _tier("nvlink")))
    assert_message(err, path, "links.1.name = 'nvlink'", "a name no other tier of the profile has")


def test_outermost_tier_with_domain_devices(tmp_path):
    err, path = hardware_error(tmp_path, _links(_tier("a", 8), _tier("b", 64)))
    assert_message(err, path, "links.1.domain_devices = 64", "no value on the outermost tier")


def test_inner_tier_without_domain_devices(tmp_path):
    err, path = hardware_error(tmp_path, _links(_tier("a"), _tier("b")))
    assert_message(err, path, "links.0.domain_devices = (missing)", "a value on every tier but the outermost")


def test_no_link_tiers(tmp_path):
    err, path = hardware_error(tmp_path, 'extends = "h100-sxm5-80gb"\nlinks = []\n')
    assert_message(err, path, "links = []", "at least one link tier")


def test_single_tier_is_fine(tmp_path):
    path = tmp_path / "one.toml"
    path.write_text(_links(_tier("only")))
    hw = load_hardware(str(path))
    assert len(hw.links) == 1 and hw.links[0].domain_devices is None


@pytest.mark.parametrize(
    "text",
    [
        'extends = "h100-sxm5-80gb"\nlinks = []\n',
        'extends = "h100-sxm5-80gb"\n[device]\ngemm_tiles = []\n',
    ],
    ids=["links", "gemm_tiles"],
)
def test_validator_messages_do_not_stutter(tmp_path, text):
    err, _ = hardware_error(tmp_path, text)
    assert "expected expected" not in str(err)


# --------------------------------------------------------------------------- references


def test_space_file_unknown_model(tmp_path):
    path = write_toml(tmp_path / "space.toml", {**SPACE, "model": "llama3-9b"})
    with pytest.raises(CatalogError) as info:
        load_space(path)
    assert_message(info.value, path, "model", "'llama3-9b'", *MODELS)
    assert info.value.source == path


def test_space_file_unknown_hardware(tmp_path):
    path = write_toml(tmp_path / "space.toml", {**SPACE, "hardware": "b200"})
    with pytest.raises(CatalogError) as info:
        load_space(path)
    assert_message(info.value, path, "hardware", "'b200'", *HARDWARE)


def test_space_file_missing_model_path(tmp_path):
    path = write_toml(tmp_path / "space.toml", {**SPACE, "model": "models/nope.toml"})
    with pytest.raises(CatalogError) as info:
        load_space(path)
    assert_message(info.value, path, "model", "'models/nope.toml'", "existing TOML file")


def test_override_unknown_model():
    with pytest.raises(CatalogError) as info:
        load_space("llama3-8b-h100-64", {"model": "nope"})
    assert_message(info.value, "llama3-8b-h100-64.toml", "command-line model", "'nope'", "llama3-8b")


def test_unknown_catalog_name():
    with pytest.raises(CatalogError) as info:
        load_model("llama3-9b")
    assert_message(info.value, "command line", "model", "'llama3-9b'", *MODELS)
    with pytest.raises(CatalogError) as info:
        load_space("no-such-space")
    assert_message(info.value, "space", "'no-such-space'", *SPACES)


def test_path_does_not_exist(tmp_path):
    missing = str(tmp_path / "nope.toml")
    with pytest.raises(CatalogError) as info:
        load_model(missing)
    assert_message(info.value, "model", repr(missing), "an existing TOML file")
    with pytest.raises(CatalogError) as info:
        load_hardware(missing)
    assert_message(info.value, "hardware", repr(missing), "an existing TOML file")
    with pytest.raises(CatalogError) as info:
        load_space(missing)
    assert_message(info.value, "space", repr(missing), "an existing TOML file")


def test_path_is_a_directory(tmp_path):
    with pytest.raises(CatalogError) as info:
        load_model(str(tmp_path))
    assert_message(info.value, "model", repr(str(tmp_path)), "an existing TOML file")


def test_invalid_toml(tmp_path):
    path = tmp_path / "broken.toml"
    path.write_text('name = "x"\nlayers = \n')
    with pytest.raises(CatalogError) as info:
        load_model(str(path))
    assert_message(info.value, str(path), "'broken.toml'", "valid TOML", "line 2")


def test_invalid_toml_space(tmp_path):
    path = tmp_path / "broken-space.toml"
    path.write_text("[dimensions\ntp = [1]\n")
    with pytest.raises(CatalogError) as info:
        load_space(str(path))
    assert_message(info.value, str(path), "valid TOML")


def test_extends_cycle(tmp_path):
    (tmp_path / "a.toml").write_text('extends = "b.toml"\nname = "a"\n')
    (tmp_path / "b.toml").write_text('extends = "./a.toml"\nname = "b"\n')
    with pytest.raises(CatalogError) as info:
        load_hardware(str(tmp_path / "a.toml"))
    assert_message(info.value, str(tmp_path), "extends", ".toml'", "no cycle of extends")


def test_extends_self(tmp_path):
    (tmp_path / "self.toml").write_text('extends = "self.toml"\n')
    with pytest.raises(CatalogError) as info:
        load_model(str(tmp_path / "self.toml"))
    assert_message(info.value, str(tmp_path / "self.toml"), "extends = 'self.toml'", "no cycle")


def test_extends_unknown_base(tmp_path):
    path = tmp_path / "x.toml"
    path.write_text('extends = "h900"\n')
    with pytest.raises(CatalogError) as info:
        load_hardware(str(path))
    assert_message(info.value, str(path), "hardware", "'h900'", *HARDWARE)


def test_extends_not_a_string(tmp_path):
    path = tmp_path / "x.toml"
    path.write_text("extends = 3\n")
    with pytest.raises(CatalogError) as info:
        load_hardware(str(path))
    assert_message(info.value, str(path), "extends = 3", "name or path")


# --------------------------------------------------------------------------- space dimensions


def test_enum_value_not_a_label(tmp_path):
    err = space_error(tmp_path, dimensions={"recompute": ["none", "partial"]})
    assert_message(err, "spaces/user.toml", "dimensions.recompute", "'partial'", "'none'", "'selective'", "'full'")


def test_schedule_not_a_label(tmp_path):
    err = space_error(tmp_path, dimensions={"schedule": ["zero-bubble"]})
    assert_message(err, "spaces/user.toml", "dimensions.schedule", "'zero-bubble'", "'gpipe'", "'1f1b'", "'interleaved'")


@pytest.mark.parametrize(
    "dim,values",
    [("tp", [2, 2]), ("recompute", ["full", "full"]), ("sequence_parallel", [True, True]), ("dp", [1, 8, 1])],
)
def test_duplicate_values(tmp_path, dim, values):
    err = space_error(tmp_path, dimensions={dim: values})
    assert_message(err, "spaces/user.toml", f"dimensions.{dim}", repr(values), "distinct values")


@pytest.mark.parametrize("dim", ["tp", "dp", "recompute", "schedule", "zero"])
def test_empty_list(tmp_path, dim):
    err = space_error(tmp_path, dimensions={dim: []})
    assert_message(err, "spaces/user.toml", f"dimensions.{dim} = []", "at least one value")


def test_zero_stage_out_of_range(tmp_path):
    err = space_error(tmp_path, dimensions={"zero": [4]})
    assert_message(err, "spaces/user.toml", "dimensions.zero", "4", "less than or equal to 3")


def test_dimension_value_zero(tmp_path):
    err = space_error(tmp_path, dimensions={"tp": [1, 0]})
    assert_message(err, "spaces/user.toml", "dimensions.tp", "0", "greater than 0")


def test_dtype_unknown(tmp_path):
    space = space_from_raw({**SPACE, "dtype": "fp4"}, "spaces/user.toml", tmp_path)
    with pytest.raises(CatalogError) as info:
        check_space(space)
    assert_message(info.value, "spaces/user.toml", "dtype = 'fp4'", "'bf16'", "'fp8'")
    with pytest.raises(CatalogError):
        Encoder(space)


def test_dtype_not_on_hardware(tmp_path):
    raw = {**SPACE, "hardware": "a100-sxm4-80gb", "dtype": "fp8"}
    space = space_from_raw(raw, "spaces/user.toml", tmp_path)
    with pytest.raises(CatalogError) as info:
        Encoder(space)
    assert_message(info.value, "spaces/user.toml", "dtype = 'fp8'", "a100-sxm4-80gb", "'bf16'", "'tf32'")
    assert "'fp8'" not in info.value.expected
    # the same precision is fine on a part that has it
    Encoder(space_from_raw({**raw, "hardware": "h100-sxm5-80gb"}, "spaces/user.toml", tmp_path))


def test_dtype_not_on_extended_hardware(tmp_path):
    raw = {**SPACE, "hardware": "a100-sxm4-40gb", "dtype": "fp8"}
    with pytest.raises(CatalogError, match="a100-sxm4-40gb"):
        Encoder(space_from_raw(raw, "spaces/user.toml", tmp_path))


def test_space_file_dimension_error_names_file(tmp_path):
    path = write_toml(tmp_path / "space.toml", {**SPACE, "dimensions": {"recompute": ["partial"]}})
    with pytest.raises(CatalogError) as info:
        Encoder(load_space(path))
    assert_message(info.value, path, "dimensions.recompute", "'partial'")


def test_dp_auto_is_the_default(tmp_path):
    auto = space_from_raw({**SPACE, "dimensions": {"dp": "auto"}}, "s", tmp_path)
    omitted = space_from_raw(SPACE, "s", tmp_path)
    assert auto.spec == omitted.spec
    assert auto.spec.dimensions.dp is None


# --------------------------------------------------------------------------- empty spaces


def test_space_with_no_valid_row(tmp_path):
    space = space_from_raw({**SPACE, "devices": 3, "dimensions": {"tp": [2]}}, "s", tmp_path)
    encoded = Encoder(space).encode_all()
    assert encoded.n_rows == 0
    assert encoded.n_combinations >= 1
    assert encoded.first_reason[Reason.DEVICE_COUNT] == encoded.n_combinations
    assert encoded.first_reason[Reason.VALID] == 0
    assert all(col.shape == (0,) for col in encoded.columns.values())
    # the same with data-parallel sizes spelt out
    space = space_from_raw({**SPACE, "devices": 3, "dimensions": {"tp": [2], "dp": [1, 3]}}, "s", tmp_path)
    encoded = Encoder(space).encode_all()
    assert (encoded.n_rows, encoded.n_combinations) == (0, 2)
    assert encoded.first_reason[Reason.DEVICE_COUNT] == 2


def test_space_with_no_valid_row_other_reason(tmp_path):
    raw = {**SPACE, "devices": 1, "global_batch": 3, "dimensions": {"micro_batch": [2, 4]}}
    encoded = Encoder(space_from_raw(raw, "s", tmp_path)).encode_all()
    assert encoded.n_rows == 0
    assert encoded.first_reason[Reason.BATCH] == 2 == encoded.n_combinations


def test_mla_attention_runs_a_kernel_that_has_unequal_head_dims():
    """FlashAttention 1 and 2 take one head width for Q, K and V; MLA's queries and keys
    are 128 + 64 = 192 wide and its values 128 (DeepSeek-V2 and V3), so a space asking
    for either runs the FlashAttention-3 class (cuDNN, FA3, FlashMLA) on them. A GQA model
    keeps what it asks for, and "flash3" is kept by both."""
    mla, gqa = load_model("deepseek-v3"), load_model("llama3-70b")
    assert (mla.mla.qk_nope_head_dim + mla.mla.qk_rope_head_dim, mla.mla.v_head_dim) == (192, 128)
    assert [mla.attention_kernel(k) for k in ("flash1", "flash2", "flash3")] == ["flash3"] * 3
    assert load_model("deepseek-v2").attention_kernel("flash2") == "flash3"
    assert [gqa.attention_kernel(k) for k in ("flash1", "flash2", "flash3")] == ["flash1", "flash2", "flash3"]
