"""Batch arguments sent to PostgreSQL as ready-made binary arrays (``Database.call_binary``),
packed with one ``struct`` call per array instead of element by element by psycopg:
``Int8Array`` (ints -> ``bigint[]``), ``Int4Array`` (ints -> ``integer[]``), ``EpochMsArray``
(epoch milliseconds -> ``timestamptz[]``). No element may be None. Registered globally
(``psycopg.adapters``) at import, before any connection is made, for these classes only.
The recorder's cost with and without them: docs/benchmarks.md, "Recurring schedules".
"""

from __future__ import annotations

import struct

import psycopg
from psycopg.adapt import Dumper
from psycopg.pq import Format

_PG_EPOCH_MS = 946_684_800_000  # 2000-01-01T00:00:00Z in Unix epoch milliseconds


class Int8Array(list):
    """ints sent as bigint[]"""


class Int4Array(list):
    """ints sent as integer[]"""


class EpochMsArray(list):
    """epoch milliseconds sent as timestamptz[]"""


def _packer(elem_oid: int, code: str, size: int, convert=None):
    def pack(values: list) -> bytes:
        n = len(values)
        head = struct.pack(">iiiii", 1, 0, elem_oid, n, 1) if n else struct.pack(">iii", 0, 0, elem_oid)
        if not n:
            return head
        vals = values if convert is None else [convert(v) for v in values]
        flat = [x for v in vals for x in (size, v)]
        return head + struct.pack(">" + ("i" + code) * n, *flat)
    return pack


def _dumper(name: str, array_oid: int, pack) -> type[Dumper]:
    def dump(self, obj: list) -> bytes:
        return pack(obj)
    return type(name, (Dumper,), {"format": Format.BINARY, "oid": array_oid, "dump": dump})


_pack_int8 = _packer(20, "q", 8)
_pack_int4 = _packer(23, "i", 4)
_pack_ts = _packer(1184, "q", 8, lambda ms: (ms - _PG_EPOCH_MS) * 1000)

psycopg.adapters.register_dumper(Int8Array, _dumper("Int8ArrayDumper", 1016, _pack_int8))
psycopg.adapters.register_dumper(Int4Array, _dumper("Int4ArrayDumper", 1007, _pack_int4))
psycopg.adapters.register_dumper(EpochMsArray, _dumper("EpochMsArrayDumper", 1185, _pack_ts))
