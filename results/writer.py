"""Streaming Parquet output that never looks complete before it is.

Batches are appended to ``NAME.partial`` next to the target; ``close()``
writes the footer (with metadata known only at the end, such as the encoder's
reason counts) and atomically renames it onto the target. If the writer exits
with an exception (Ctrl-C included), or leaves the with-block without
``close()`` (``discard()``: a result judged incomplete, such as a sweep with no
valid candidate), the partial file is removed and any earlier complete file at
the target is left byte-identical. The finished file is fsynced before the
rename, and the folder after it, so a crash never leaves a renamed file whose
bytes are not on disk. The command line makes SIGTERM an interrupt
(``explorer.signals``), so a run a scheduler stops cleans up as one
stopped by Ctrl-C does.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from paraspace.results.rank import ResultsError
from paraspace.results.schema import BY_NAME, META_COLUMNS, Column

PARTIAL_SUFFIX = ".partial"
#: the first four bytes of every Parquet file (and its last four)
PARQUET_MAGIC = b"PAR1"


def arrow_schema(strategy: list[tuple[str, pa.DataType, str]], metrics: tuple[Column, ...]) -> pa.Schema:
    """Schema of a result file: row id, strategy columns, n_microbatches, metrics."""
    fields = [pa.field(BY_NAME["row_id"].name, BY_NAME["row_id"].type, nullable=False)]
    fields += [pa.field(name, typ, nullable=False) for name, typ, _ in strategy]
    fields.append(pa.field(BY_NAME["n_microbatches"].name, BY_NAME["n_microbatches"].type, nullable=False))
    fields += [pa.field(c.name, c.type, nullable=c.nullable) for c in metrics]
    return pa.schema(fields)


def to_arrow(columns: dict[str, np.ndarray], schema: pa.Schema, labels: dict[str, list[str]]) -> pa.Table:
    """Columns (enum codes as integers) as a table of ``schema``; enum codes become dictionary strings."""
    arrays = []
    for field in schema:
        values = columns[field.name]
        if pa.types.is_dictionary(field.type):
            names = pa.array(labels[field.name], type=pa.string())
            arrays.append(pa.DictionaryArray.from_arrays(pa.array(values.astype(np.int8)), names))
        elif pa.types.is_boolean(field.type):
            arrays.append(pa.array(values != 0))
        elif field.nullable:  # NaN marks "does not exist"
            arrays.append(pa.array(values.astype(field.type.to_pandas_dtype(), copy=False), from_pandas=True))
        else:
            arrays.append(pa.array(values.astype(field.type.to_pandas_dtype(), copy=False)))
    return pa.Table.from_arrays(arrays, schema=schema)


class ResultWriter:
    """Context manager that streams tables into a Parquet file, atomically."""

    def __init__(self, path: str | Path, schema: pa.Schema, metadata: dict[str, Any],
                 column_docs: dict[str, dict[str, str]]) -> None:
        self.path = Path(path)
        self.partial = partial_path(self.path)
        self.schema = schema.with_metadata({k: _text(v) for k, v in metadata.items()}
                                           | {META_COLUMNS: json.dumps(column_docs)})
        self.rows = 0
        self._writer: pq.ParquetWriter | None = None
        check_replaceable(self.path)

    def __enter__(self) -> ResultWriter:
        ensure_folder(self.path.parent)
        earlier = os.path.lexists(self.partial)  # an earlier run's leftover, which a failed open leaves
        try:
            with writing(self.path):
                self._writer = pq.ParquetWriter(self.partial, self.schema, compression="zstd")
            return self
        except BaseException:  # an error or an interrupt once the file may exist: __exit__ will not run
            opened, self._writer = self._writer, None
            try:
                if opened is not None:
                    opened.close()
            finally:  # made (or truncated) by this open, wherever the interrupt landed: not left behind
                if opened is not None or not earlier:
                    self.partial.unlink(missing_ok=True)
            raise

    def write(self, table: pa.Table) -> None:
        assert self._writer is not None, "write() outside the with-block"
        if table.num_rows:
            self._writer.write_table(table)
            self.rows += table.num_rows

    def close(self, final_metadata: dict[str, Any] | None = None) -> Path:
        """Finish the file and rename it onto the target; returns the target."""
        assert self._writer is not None
        try:
            if final_metadata:
                self._writer.add_key_value_metadata({k: _text(v) for k, v in final_metadata.items()})
            self._writer.close()
            self._writer = None
            check_replaceable(self.path)  # again: something else may have been written there meanwhile
            with writing(self.path):
                publish(self.partial, self.path)
        finally:  # gone once renamed; else (an error, an interrupt at any point) nothing that looks half done stays
            self._writer = None
            self.partial.unlink(missing_ok=True)
        return self.path

    def discard(self) -> None:
        """Drop what was written; the target keeps whatever it held before."""
        if self._writer is not None:
            try:
                self._writer.close()
            finally:
                self._writer = None
                self.partial.unlink(missing_ok=True)

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.discard()  # not closed: an error, an interrupt or an incomplete result; leave nothing that looks done


def check_replaceable(path: str | Path, *, starts_with: bytes = PARQUET_MAGIC,
                      kind: str = "Parquet result") -> None:
    """Refuse, with a ``ResultsError`` naming ``path``, to write over anything but an earlier
    output of ours (a file beginning with ``starts_with``: a Parquet file by default) or an
    empty file: never a space TOML, notes or a folder, which a mistyped ``--out`` would
    otherwise destroy. Every Parquet-writing command checks its target here
    (``ResultWriter``), the report its page (``results.report.write``)."""
    path = Path(path)
    with writing(path):  # a name too long to look up, a folder that cannot be searched
        if not path.exists():
            return
    expected = f"{str(path)!r}: expected a new file or an earlier {kind} to replace"
    if not path.is_file():
        raise ResultsError(f"{path}: output file = {expected} (it is a folder or another non-file; nothing written)")
    try:
        with open(path, "rb") as handle:
            head = handle.read(len(starts_with))
    except OSError as err:
        raise ResultsError(f"{path}: output file = {expected} (it cannot be read: {err.strerror or err}; nothing "
                           "written)") from None
    if head and head != starts_with:
        raise ResultsError(f"{path}: output file = {expected} (it is not one: it starts with {head[:16]!r}; "
                           "refusing to overwrite it, nothing written: give another --out or remove the file)")


def check_writable(path: str | Path, *, starts_with: bytes = PARQUET_MAGIC, kind: str = "Parquet result") -> None:
    """``check_replaceable``, then that the file can be written at all: its folder exists or can be
    created, and takes the staging file ``NAME.partial`` (created and removed here; an earlier one
    is left as it was). A ``ResultsError`` naming ``path`` otherwise (``writing``). Commands call
    it before their work, so that an unusable ``--out`` fails in a second, not after the run."""
    check_replaceable(path, starts_with=starts_with, kind=kind)
    path = Path(path)
    ensure_folder(path.parent)
    staged = partial_path(path)
    earlier = os.path.lexists(staged)  # an earlier run's leftover (kept, not truncated), or a folder (refused)
    with writing(path):
        try:
            try:
                fd = os.open(staged, os.O_WRONLY | (0 if earlier else os.O_CREAT | os.O_EXCL), 0o644)
            except FileExistsError:  # made meanwhile by someone else: theirs, kept
                earlier, fd = True, os.open(staged, os.O_WRONLY)
            os.close(fd)
        finally:  # the probe is removed however the block ends: an interrupt between its open and
            if not earlier:  # its removal (a scheduler's SIGTERM as a run starts) left it behind
                staged.unlink(missing_ok=True)


def partial_path(path: str | Path) -> Path:
    """The staging file of an output: ``NAME.partial`` beside it."""
    path = Path(path)
    return path.with_name(path.name + PARTIAL_SUFFIX)


@contextlib.contextmanager
def writing(path: str | Path, *, what: str = "a file") -> Iterator[Path]:
    """Run a block that creates or replaces ``path`` (or files for it: its staging file, a folder's
    contents, ``what`` says which); an ``OSError`` it raises (a folder that cannot be written, a
    name too long, a folder where the file goes) becomes a ``ResultsError`` naming ``path``, the
    file that failed and why: the one message every command gives for an output it cannot write."""
    try:
        yield Path(path)
    except OSError as err:
        raise unwritable(path, err, what=what) from None


def unwritable(path: str | Path, err: OSError, *, what: str = "a file") -> ResultsError:
    """The ``ResultsError`` of ``writing``: ``PATH: expected a file that can be written (REASON)``."""
    reason = os.strerror(err.errno) if err.errno else (err.strerror or str(err) or type(err).__name__)
    failed = err.filename
    if failed is not None and os.fsdecode(failed) != str(path):
        reason = f"{os.fsdecode(failed)}: {reason}"
    return ResultsError(f"{path}: expected {what} that can be written ({reason})")


def ensure_folder(folder: str | Path) -> Path:
    """``folder``, created with its parents where missing; a ``ResultsError`` naming it when it cannot be."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        blocker = next((p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()), None)
        reason = f"{blocker} is a file" if blocker else (err.strerror or str(err))
        raise ResultsError(f"{folder}: output folder = {str(folder)!r}: expected a folder that exists or can be "
                           f"created ({reason})") from None
    return folder


def publish(finished: Path, target: Path) -> None:
    """Rename a finished file onto ``target`` durably: its bytes, then the rename, reach the disk."""
    with open(finished, "rb") as handle:
        os.fsync(handle.fileno())
    os.replace(finished, target)
    try:
        folder = os.open(target.parent, os.O_RDONLY)
    except OSError:  # a platform whose folders cannot be opened (Windows): the rename is as durable as it gets
        return
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)


def read_metadata(path: str | Path) -> dict[str, str]:
    """The paraspace key-value metadata of a result file."""
    meta = pq.ParquetFile(path).metadata.metadata or {}
    return {k.decode(): v.decode() for k, v in meta.items() if k.startswith(b"paraspace.")}
