"""Delimited numeric text: CSV (and TSV), and the UCI Letter file, a CSV of fixed shape.

pyarrow parses the file; when it refuses a line, the file is scanned again with the `csv`
module to name the line and the value (pyarrow's message gives neither reliably).
"""

from __future__ import annotations

import csv
import os
import re
from pathlib import Path

from lshdist.errors import FormatError, InputError
from lshdist.inputs.data import InputData
from lshdist.inputs.files import READ_ERRORS, Probe, is_gzip, open_text
from lshdist.inputs.formats.tables import label_and_id_columns, table_to_data

_LETTER_LINE = re.compile(r"^[A-Za-z],(?:\s*-?\d+\s*,){15}\s*-?\d+\s*$")
_INT64_MAX = 2**63 - 1
_NOT_CSV = "is it really CSV? pass the right --format, or none to detect it"


def sniff_letter(probe: Probe) -> bool:
    """A delimited text file whose first line is a letter and 16 integers."""
    return probe.is_delimited_text and bool(_LETTER_LINE.match(probe.first_line))


def sniff_csv(probe: Probe) -> bool:
    """Any delimited text file (tried after the formats with a more specific first line)."""
    return probe.is_delimited_text


def _is_number(field: str) -> bool:
    try:
        float(field)
    except ValueError:
        return False
    return True


def _is_int64(field: str) -> bool:
    try:
        return -_INT64_MAX - 1 <= int(field.strip()) <= _INT64_MAX
    except ValueError:
        return False


def _looks_like_header(rows: list[list[str]]) -> bool:
    """A first row of names: none of it is a number, or a column is a number only below it."""
    first = rows[0]
    if not any(_is_number(f) for f in first):
        return True
    if len(rows) > 1:
        return any(not _is_number(a) and _is_number(b) for a, b in zip(first, rows[1]))
    return False


def _find_bad_line(
    path: Path,
    text: str,
    names: list[str],
    ncols: int,
    delimiter: str,
    header: bool,
    id_col: int | None,
) -> InputError:
    """The line pyarrow refused (message ``text``), as a message naming it and its value."""
    ragged = "Expected" in text and "columns" in text
    bad_column = re.search(r"column #(\d+)", text)
    with open_text(path) as f:
        reader = csv.reader(f, delimiter=delimiter)
        for row in reader:
            lineno = reader.line_num  # physical line (quoted fields may span lines)
            if not row or (header and lineno == 1):
                continue
            if ragged and len(row) != ncols:
                return InputError(
                    f"{str(path)!r} line {lineno} has {len(row)} fields, but the first line has "
                    f"{ncols}; every row needs the same number of fields: fix or remove the line"
                )
            if bad_column and not ragged:
                i = int(bad_column.group(1))
                value = row[i] if i < len(row) else ""
                if i == id_col and value.strip() and not _is_int64(value):
                    return InputError(
                        f"{str(path)!r} id column {names[i]!r} holds {value!r} on line "
                        f"{lineno}, which is not an int64 integer; ids must be integers: fix "
                        "the value, or drop --id-column to number the rows 0..N-1"
                    )
                if i != id_col and value.strip() and not _is_number(value):
                    return InputError(
                        f"{str(path)!r} column {names[i]!r} holds the non-numeric value "
                        f"{value!r} on line {lineno}; features must be numbers: fix the value, "
                        "or name the column with --label-column if it holds the labels"
                    )
    return FormatError(f"{str(path)!r} could not be read as CSV ({text}); {_NOT_CSV}")


def read_csv(
    path: str | os.PathLike[str],
    *,
    label_column: str | int | None = None,
    header: bool | None = None,
    delimiter: str = ",",
    id_column: str | int | None = None,
) -> InputData:
    """A numeric CSV file (``.gz`` allowed).

    Parameters
    ----------
    label_column : str or int, optional
        Name (with a header) or index (negative counts from the end) of the label column.
        Default: a column named ``label`` or ``y`` if the header has one, else no labels.
    header : bool, optional
        Whether the first line names the columns; default: guessed (see `_looks_like_header`).
    delimiter : str
        Field separator.
    id_column : str or int, optional
        Name or index of a column of unique int64 row ids; default: none (ids ``0..N-1``).
    """
    import pyarrow as pa
    import pyarrow.csv as pacsv

    path = Path(path)
    source = str(path)
    try:
        with open_text(path) as f:
            rows = (r for r in csv.reader(f, delimiter=delimiter) if r)
            first = [row for _, row in zip(range(2), rows)]
    except READ_ERRORS as exc:
        raise FormatError(
            f"{source!r} is not readable CSV text ({type(exc).__name__}: {exc}); {_NOT_CSV}"
        ) from None
    if not first:
        raise InputError(f"{source!r} is empty; give a file with at least one row")
    ncols = len(first[0])
    if header is None:
        header = _looks_like_header(first)
    names = [c.strip() for c in first[0]] if header else [str(i) for i in range(ncols)]
    label, id_col = label_and_id_columns(
        label_column, id_column, names if header else None, ncols, source
    )
    internal = [f"c{i}" for i in range(ncols)]  # header names may repeat or be empty
    types = {
        c: pa.string() if i == label else pa.int64() if i == id_col else pa.float64()
        for i, c in enumerate(internal)
    }
    try:
        table = pacsv.read_csv(
            pa.input_stream(str(path), compression="gzip" if is_gzip(path) else None),
            read_options=pacsv.ReadOptions(column_names=internal, skip_rows=1 if header else 0),
            parse_options=pacsv.ParseOptions(delimiter=delimiter),
            convert_options=pacsv.ConvertOptions(column_types=types, strings_can_be_null=True),
        )
    except pa.ArrowInvalid as exc:
        try:
            error = _find_bad_line(path, str(exc), names, ncols, delimiter, header, id_col)
        except READ_ERRORS:
            error = FormatError(f"{source!r} could not be read as CSV ({exc}); {_NOT_CSV}")
        raise error from None
    except (pa.ArrowException, OSError) as exc:
        raise FormatError(f"{source!r} could not be read as CSV ({exc}); {_NOT_CSV}") from None
    return table_to_data(table, names, label, id_col, source, "csv")


def read_letter(path: str | os.PathLike[str]) -> InputData:
    """The UCI Letter Recognition file: a capital letter, then 16 integer features, no header."""
    data = read_csv(path, label_column=0, header=False)
    if data.d != 16:
        raise FormatError(
            f"{str(path)!r} has {data.d + 1} fields per line, but the UCI Letter format has 17 "
            "(a letter, then 16 integers); read it with --format csv instead"
        )
    data.format = "letter"
    return data
