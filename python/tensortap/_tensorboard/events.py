"""TensorBoard's event files, encoded by hand (writers/src/tensorboard/EVENTS.md):
TFRecord framing with the masked CRC-32C, and the few protobuf messages an
export writes (Event, Summary, its scalar, histogram and text values), with
nothing but the standard library: no protobuf package.
"""

from __future__ import annotations

import re
import struct
import time
from typing import Optional

import numpy as np

FILE_VERSION = "brain.Event:2"


# -- CRC-32C (Castagnoli), table-driven ----------------------------------------


def _crc_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return tuple(table)


_CRC_TABLE = _crc_table()


def crc32c(data: bytes) -> int:
    """The CRC-32C of `data`: reflected polynomial 0x82F63B78, initial value
    and final xor 0xFFFFFFFF (crc32c(b"123456789") == 0xE3069283)."""
    crc = 0xFFFFFFFF
    table = _CRC_TABLE
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    """TFRecord's masked CRC-32C of `data`."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def frame(event: bytes) -> bytes:
    """One TFRecord: the length as a little-endian uint64, its masked CRC, the
    serialized event, the event's masked CRC."""
    header = struct.pack("<Q", len(event))
    return header + struct.pack("<I", masked_crc32c(header)) + event + struct.pack("<I", masked_crc32c(event))


# -- protobuf, by hand ---------------------------------------------------------

_U64 = (1 << 64) - 1


def _varint(n: int) -> bytes:
    """A varint of the unsigned 64-bit `n` (an int64 as its two's complement)."""
    n &= _U64
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2): string, bytes, message, packed."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _double(number: int, value: float) -> bytes:
    return _varint(number << 3 | 1) + struct.pack("<d", value)


def _doubles(number: int, values) -> bytes:
    """A packed repeated double field."""
    return _field(number, np.asarray(values, dtype="<f8").tobytes())


def _event(step: int, summary: Optional[bytes] = None, file_version: Optional[str] = None) -> bytes:
    """Event { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }"""
    out = _double(1, time.time()) + _varint(2 << 3 | 0) + _varint(step)
    if file_version is not None:
        out += _field(3, file_version.encode("utf-8"))
    if summary is not None:
        out += _field(5, summary)
    return out


# A name's bytes that are not UTF-8 come from the reader as lone surrogates
# (U+DC80..U+DCFF); a protobuf string must be UTF-8, or TensorBoard's parser
# refuses the whole event. Each becomes U+FFFD in a tag.
_SURROGATE = re.compile("[\ud800-\udfff]")


def tag_text(tag: str) -> str:
    """The tag as the event holds it: `tag` with each lone surrogate as U+FFFD."""
    return _SURROGATE.sub("\ufffd", tag)


def _tag_field(tag: str) -> bytes:
    return _field(1, tag_text(tag).encode("utf-8"))


def _summary(*values: bytes) -> bytes:
    """Summary { repeated Value value = 1; } of serialized Summary.Value messages."""
    return b"".join(_field(1, v) for v in values)


def _scalar_head(tag: str) -> bytes:
    """A Summary's value field holding Value { tag; simple_value = 2 }, up to
    the float's four bytes, which follow it."""
    tag_field = _tag_field(tag)
    return _varint(1 << 3 | 2) + _varint(len(tag_field) + 5) + tag_field + b"\x15"


def _histogram_value(tag: str, h) -> bytes:
    """Value { tag; HistogramProto histo = 5 }."""
    proto = (_double(1, h.min) + _double(2, h.max) + _double(3, h.num) + _double(4, h.sum)
             + _double(5, h.sum_squares) + _doubles(6, h.bucket_limit) + _doubles(7, h.bucket))
    return _tag_field(tag) + _field(5, proto)


def _text_value(tag: str, text: bytes) -> bytes:
    """Value { tag; TensorProto tensor = 8 (DT_STRING, no dims, one string_val);
    SummaryMetadata metadata = 9 (plugin "text") }."""
    tensor = _varint(1 << 3 | 0) + _varint(7) + _field(2, b"") + _field(8, text)
    metadata = _field(1, _field(1, b"text"))
    return _tag_field(tag) + _field(8, tensor) + _field(9, metadata)


CUSTOM_SCALARS_TAG = "custom_scalars__config__"


def _custom_scalars_value(layout) -> bytes:
    """Value { tag "custom_scalars__config__"; TensorProto tensor = 8 (DT_STRING,
    no dims, one string_val: the serialized Layout); SummaryMetadata metadata = 9
    (plugin "custom_scalars") }, the custom scalars plugin's layout.
    `layout`: [(category title, [(chart title, [tag regex, ...]), ...]), ...];
    Layout { repeated Category category = 2 }, Category { string title = 1;
    repeated Chart chart = 2 }, Chart { string title = 1;
    MultilineChartContent multiline = 2 }, MultilineChartContent { repeated
    string tag = 1 } (TensorBoard's plugins/custom_scalar/layout.proto)."""
    categories = b""
    for title, charts in layout:
        body = _field(1, title.encode("utf-8"))
        for chart_title, tags in charts:
            multiline = b"".join(_field(1, t.encode("utf-8")) for t in tags)
            body += _field(2, _field(1, chart_title.encode("utf-8")) + _field(2, multiline))
        categories += _field(2, body)
    tensor = _varint(1 << 3 | 0) + _varint(7) + _field(2, b"") + _field(8, categories)
    metadata = _field(1, _field(1, b"custom_scalars"))
    return _tag_field(CUSTOM_SCALARS_TAG) + _field(8, tensor) + _field(9, metadata)
