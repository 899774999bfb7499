"""A domain database: tables of JSON records, copied on write, and tau2-bench's canonical hash.

A database is a dict of tables, each a dict from id to a record (nested dicts, lists, strings, floats,
bools, None). Every episode starts from the same loaded file, so an episode's `Database` shares the
loaded records (`BaseTables`) and copies a record only when a tool is about to change it
(`Database.writable`): a fresh database costs a shallow copy of each table, not a 2.8 MB deep copy.
Tools read records through `get` / `table` and must never change what those return.

The hash rule (tau2-bench's): SHA-256 hex of `json.dumps(tables, sort_keys=True, default=str)` with
Python's default separators and ASCII escaping. `Database.hash` builds that same text from each
record's canonical JSON, reusing the loaded records' texts, so hashing costs a join instead of a full
encode (tests check it against the plain rule).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

Record = dict[str, Any]


def canonical_json(value: Any) -> str:
    """The text the hash rule encodes `value` as."""
    return json.dumps(value, sort_keys=True, default=str)


def copy_json(value: Any) -> Any:
    """A deep copy of JSON data (dicts keep their key order)."""
    if isinstance(value, dict):
        return {k: copy_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [copy_json(v) for v in value]
    return value


def deep_merge(record: Record, update: Record) -> None:
    """Merge `update` into `record` in place: nested dicts merge key by key, anything else replaces."""
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(record.get(key), dict):
            deep_merge(record[key], value)
        else:
            record[key] = copy_json(value)


class BaseTables:
    """The loaded tables of a database file (never changed after loading) and their records' texts."""

    def __init__(self, tables: dict[str, dict[str, Record]]):
        for name, table in tables.items():
            if not isinstance(table, dict):
                raise ValueError(f"table {name!r} is a {type(table).__name__}, not a dict of records")
        self.tables = tables
        self.texts = {name: {key: canonical_json(record) for key, record in table.items()}
                      for name, table in tables.items()}


class Database:
    """One episode's tables: the loaded records until written, private copies after."""

    def __init__(self, base: BaseTables):
        self._base = base
        self._tables = {name: dict(table) for name, table in base.tables.items()}

    @property
    def table_names(self) -> tuple[str, ...]:
        return tuple(self._tables)

    def table(self, name: str) -> dict[str, Record]:
        """The live table (read only: change records through `writable` and `insert`)."""
        return self._tables[name]

    def get(self, table: str, key: Any) -> Record | None:
        """The record `key` of `table`, or None."""
        return self._tables[table].get(key)

    def writable(self, table: str, key: str) -> Record:
        """The record `key` of `table`, made private to this database so that it may be changed."""
        record = self._tables[table][key]
        if record is self._base.tables.get(table, {}).get(key):
            record = self._tables[table][key] = copy_json(record)
        return record

    def insert(self, table: str, key: str, record: Record) -> None:
        self._tables[table][key] = record

    def dump(self) -> dict[str, dict[str, Record]]:
        """A plain deep copy of all tables."""
        return copy_json(self._tables)

    def hash(self) -> str:
        """SHA-256 hex of the canonical JSON of all tables (the module's hash rule)."""
        parts = []
        for name in sorted(self._tables):
            table = self._tables[name]
            base = self._base.tables.get(name, {})
            texts = self._base.texts.get(name, {})
            text = {key: texts[key] if record is base.get(key) else canonical_json(record)
                    for key, record in table.items()}
            items = ", ".join(f"{json.dumps(key)}: {text[key]}" for key in sorted(table))
            parts.append(f"{json.dumps(name)}: {{{items}}}")
        return hashlib.sha256(("{" + ", ".join(parts) + "}").encode()).hexdigest()

    def __deepcopy__(self, memo: dict) -> "Database":
        """A copy that still shares the loaded records (forked episodes stay cheap)."""
        copy = Database.__new__(Database)
        copy._base = self._base
        copy._tables = {name: {key: record if record is self._base.tables.get(name, {}).get(key)
                               else copy_json(record) for key, record in table.items()}
                        for name, table in self._tables.items()}
        return copy
