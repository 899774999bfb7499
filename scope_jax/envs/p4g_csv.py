"""The one reader of the Persuasion for Good CSV files (`FullData/full_info.csv`, `FullData/full_dialog.csv`,
`AnnotatedData/300_dialog.csv`), for the environment (`p4g`), its human dialogues (`p4g_human`) and the
committed statistics (`p4g_stats`): a missing file, missing columns, or an unreadable encoding or CSV line
raise `P4GDataError`, one line naming the file (and the line), not a config key: the job that catches
it names its own."""

from __future__ import annotations

import csv
import pathlib
from typing import Sequence

MAX_DONATION = 2.0  # dollars: the task payment a persuadee could give


class P4GDataError(ValueError):
    """The P4G data folder lacks a file, or the file does not have the expected form."""


def read_rows(path: str | pathlib.Path, columns: Sequence[str]) -> list[tuple[int, dict[str, str | None]]]:
    """(line number, row) of every row of the CSV file `path`, which must have `columns` (a short row's
    missing cells are None)."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise P4GDataError(f"P4G data file {path} is missing")
    try:
        with path.open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            missing = [c for c in columns if c not in (reader.fieldnames or ())]
            if missing:
                raise P4GDataError(f"P4G data file {path} lacks the column(s) {', '.join(missing)}")
            return [(reader.line_num, row) for row in reader]
    except (csv.Error, UnicodeDecodeError) as e:
        raise P4GDataError(f"P4G data file {path}, line {reader.line_num + 1}: {e}") from None
