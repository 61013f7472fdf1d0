"""A sharded sweep replaces the dataset in its folder: after ``--shards 3`` then ``--shards 2``
(``--dask``), or a job array of ``--shard I/2`` over one of ``--shard I/3``, the folder holds
exactly the new run's parts and ``top`` reads it; the earlier parts go only once every new part
is written, so an array that stops part-way loses nothing. Only paraspace results of the same
space are ever removed: any other file named as a part of another shard count is refused before
the run, and nothing is written or removed."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner, Result
from test_cli_paths import space_toml

from paraspace.explorer.cli import main


def run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def parts(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def shard(space: Path, folder: Path, index: int, count: int) -> Result:
    result = run("sweep", str(space), "--shard", f"{index}/{count}", "--out", str(folder), "--no-progress", "-n", "0",
                 "--no-simulate")
    assert result.exit_code == 0, result.output
    return result


def top_ids(folder: Path) -> list[int]:
    result = run("top", str(folder), "-n", "10", "--columns", "row_id")
    assert result.exit_code == 0, result.output
    return sorted(int(line) for line in result.output.splitlines()[2:])


def test_a_job_array_of_another_shard_count_replaces_the_earlier_one(tmp_path):
    space = space_toml(tmp_path / "tiny.toml")  # four combinations
    folder = tmp_path / "nightly"
    for i in range(3):
        shard(space, folder, i, 3)
    assert top_ids(folder) == [0, 1, 2, 3]
    earlier = {name: sha(folder / name) for name in parts(folder)}
    first = shard(space, folder, 0, 2)
    # the 3-shard parts stay, whole, until the new array is: a run that stops here loses nothing
    assert parts(folder) == ["part-0-of-2.parquet", *earlier]
    assert all(sha(folder / name) == digest for name, digest in earlier.items())
    assert (f"kept 3 part(s) of an earlier run of 3 shards in {folder}/ until every part of this run's 2 is "
            "written") in first.stderr and "removed" not in first.stderr
    mixed = run("top", str(folder))
    assert mixed.exit_code == 2 and "parts of 2 and of 3 shards" in mixed.output
    second = shard(space, folder, 1, 2)  # the last part: the new array is whole, the earlier one goes
    assert f"removed 3 part(s) of an earlier run of 3 shards from {folder}/" in second.stderr
    assert parts(folder) == ["part-0-of-2.parquet", "part-1-of-2.parquet"]
    assert top_ids(folder) == [0, 1, 2, 3]


def test_parts_of_an_edited_space_say_the_folder_mixes_definitions_until_rewritten(tmp_path):
    """The space's TOML changed between two job arrays of one shard count: each part of the
    new one replaces its own, and until all have, the others are the old definition's,
    which ``top`` refuses to rank beside it; the run says so, and the last part clears it."""
    folder = tmp_path / "nightly"
    space = space_toml(tmp_path / "tiny.toml")
    for i in range(2):
        shard(space, folder, i, 2)
    edited = space_toml(tmp_path / "tiny.toml")
    edited.write_text(edited.read_text().replace("global_batch = 256", "global_batch = 128"))
    first = shard(edited, folder, 0, 2)
    assert (f"{folder}/: part-1-of-2.parquet of another definition of tiny (written before its TOML changed)"
            in first.stderr)
    assert run("top", str(folder)).exit_code == 2
    second = shard(edited, folder, 1, 2)
    assert "another definition" not in second.stderr
    assert top_ids(folder) == [0, 1, 2, 3]


@pytest.mark.parametrize("what", ["not parquet", "foreign parquet", "another space"])
def test_a_part_that_is_not_this_spaces_result_is_refused_before_the_run(tmp_path, what):
    space = space_toml(tmp_path / "tiny.toml")
    folder = tmp_path / "nightly"
    folder.mkdir()
    other = folder / "part-1-of-3.parquet"
    if what == "not parquet":
        other.write_text("notes\n")
        why = "file: expected a Parquet file"
    elif what == "foreign parquet":
        pq.write_table(pa.table({"a": [1]}), other)
        why = "metadata: expected a file written by paraspace (no paraspace.version key)"
    else:
        other_space = space_toml(tmp_path / "other.toml", name="other")
        shard(other_space, tmp_path / "elsewhere", 1, 3)
        (tmp_path / "elsewhere" / "part-1-of-3.parquet").rename(other)
        why = "space = 'other': expected 'tiny'"
    before = sha(other)
    result = run("sweep", str(space), "--shard", "0/2", "--out", str(folder), "--no-progress", "-n", "0")
    assert result.exit_code == 2, result.output
    last = result.output.splitlines()[-1]
    assert last.startswith(f"Error: {other}: {why}") and "Traceback" not in result.output, result.output
    assert last.endswith(f"; a part of another shard count, which a sweep of 2 shards into {folder} removes only "
                         "where it is a paraspace result of its own space (tiny): refusing to, nothing written (give "
                         "another --out or move the file)")
    assert parts(folder) == ["part-1-of-3.parquet"] and sha(other) == before


def test_dask_with_fewer_shards_leaves_exactly_its_parts(tmp_path):
    """The audit's case: --shards 3 then --shards 2 into one folder, then top."""
    pytest.importorskip("dask.distributed", reason="dask[distributed] (the test extra) is not installed")
    space = str(space_toml(tmp_path / "tiny.toml"))
    folder = tmp_path / "dask"
    for count in (3, 2):
        result = run("sweep", space, "--dask", "local", "--shards", str(count), "--out", str(folder), "-n", "0",
                     "--no-simulate")
        assert result.exit_code == 0, result.output
        assert parts(folder) == [f"part-{i}-of-{count}.parquet" for i in range(count)]
    assert "removed 3 part(s) of an earlier run of 3 shards" in result.stderr
    assert top_ids(folder) == [0, 1, 2, 3]
