"""The CSV / JSON Lines row scanner on byte strings (arrowstream/_formats/rowscan.py): where rows start
when bytes arrive in blocks cut anywhere. Readers and planning over real files: tests/test_text.py."""

from __future__ import annotations

import csv
import io
import itertools

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pytest
from hypothesis import given
from hypothesis import strategies as st

from arrowstream._formats.rowscan import RowScanner, row_starts, scan_units
from arrowstream._formats.text_settings import TextSettings

QUOTE = ord('"')


def blocks_of(data: bytes, cuts: list[int] | int | None) -> list[bytes]:
    """``data`` cut at ``cuts`` (offsets; those past the end are left out), or in blocks of ``cuts`` bytes."""
    if isinstance(cuts, int):
        cuts = list(range(cuts, len(data), cuts))
    bounds = [0, *sorted({c for c in cuts or () if 0 < c < len(data)}), len(data)]
    return [data[lo:hi] for lo, hi in itertools.pairwise(bounds)]


def scan(data: bytes, cuts: list[int] | int | None = None, quote: int | None = QUOTE, skip_empty: bool = True,
         ) -> tuple[list[int], list[int], bool]:
    """(row starts, line breaks before each, quoted line breaks seen) of ``data`` fed in blocks cut at ``cuts``
    (see :func:`blocks_of`), then finished with the bytes of the row left open."""
    scanner = RowScanner(quote, skip_empty)
    starts: list[int] = []
    lines: list[int] = []
    for block in blocks_of(data, cuts):
        s, n = scanner.feed(block)
        starts += s.tolist()
        lines += n.tolist()
    s, n = scanner.finish(data[scanner.row_start:])
    return starts + s.tolist(), lines + n.tolist(), scanner.quoted_newlines


def starts_every_way(data: bytes, **kwargs) -> list[int]:
    """Row starts of ``data``, checked the same whole, byte by byte, and cut at every single offset."""
    whole, lines, _ = scan(data, **kwargs)
    assert lines == [data[:s].count(b"\n") for s in whole]
    assert scan(data, 1, **kwargs)[:2] == (whole, lines)
    for cut in range(1, len(data)):
        assert scan(data, [cut], **kwargs)[:2] == (whole, lines), f"cut at {cut}"
    return whole


def test_a_quoted_field_spanning_blocks_keeps_its_line_breaks():
    data = b'id,name\n1,"one\ntwo\nthree"\n2,"x"\n3,y\n'
    assert starts_every_way(data) == [0, 8, 26, 32]
    assert scan(data)[2] and scan(data, 3)[2]           # quoted line breaks seen, wherever the blocks end
    assert not scan(b'a,"b"\nc,d\n')[2]


def test_doubled_quotes_are_a_quote_inside_the_field():
    data = b'"say ""hi""\nthen go",1\n"""",2\n"a""\nb",3\nlast,4\n'
    assert starts_every_way(data) == [0, 23, 30, 40]
    # a field that is only an escaped quote, and an empty quoted field, next to a line break
    assert starts_every_way(b'""""\n""\nx\n') == [0, 5, 8]


def test_crlf_rows_and_crlf_blank_lines():
    data = b'a,b\r\n\r\n"c\r\nd",e\r\n\r\nf,g\r\n'
    assert starts_every_way(data) == [0, 7, 19]
    assert starts_every_way(data, skip_empty=False) == [0, 5, 7, 17, 19]
    # the \r of a blank line at the end of one block, its \n at the start of the next
    assert scan(b"a\n\r\nb\n", [3]) == ([0, 4], [0, 2], False)


def test_a_lone_cr_ends_no_row():
    # rows end at \n only; pyarrow's parser also ends one at a lone \r outside quotes, so the scanner notes
    # one (test below) and planning leaves that file's rows to pyarrow
    data = b'a\rb,c\nd\re\n\r\n"\r"\n'
    assert starts_every_way(data) == [0, 6, 12]
    # a row that is only \r is empty (pyarrow strips a \r before the \n), anything more is a row
    assert starts_every_way(b"x\n\r\n\r\r\ny\n") == [0, 4, 7]


def lone_cr_every_way(data: bytes) -> bool:
    """Whether the scanner notes a lone \\r in ``data``, checked the same whole, byte by byte and at every cut."""
    def noted(cuts: list[int] | int | None) -> bool:
        scanner = RowScanner(QUOTE, True)
        for block in blocks_of(data, cuts):
            scanner.feed(block)
        return scanner.lone_cr

    whole = noted(None)
    assert noted(1) == whole
    for cut in range(1, len(data)):
        assert noted([cut]) == whole, f"cut at {cut}"
    return whole


def test_a_lone_cr_outside_quotes_is_noted_for_pyarrow_to_count_the_rows():
    # a line break to pyarrow, not to the scan: planning leaves such a file's rows to pyarrow
    assert lone_cr_every_way(b"id,name\r1,a\r2,b\r")
    assert lone_cr_every_way(b"id,name\n1,a\r2,b\n")
    assert lone_cr_every_way(b'"x"\ry\n')
    # not lone: before a \n (also across blocks), inside quotes, or ending the stream (pyarrow ends the row too)
    assert not lone_cr_every_way(b"a,b\r\n1,2\r\n\r\n")
    assert not lone_cr_every_way(b'a,"b\rc"\n"\r\r",d\n')
    assert not lone_cr_every_way(b"a,b\n1,2\r")
    assert not lone_cr_every_way(b"a,b\n1,2\n")


def test_blank_lines_are_no_rows_unless_asked():
    data = b"\n\na,1\n\n\nb,2\n\n"
    assert starts_every_way(data) == [2, 8]
    assert scan(data)[1] == [2, 5]                      # line breaks before each row: its line number - 1
    assert starts_every_way(data, skip_empty=False) == [0, 1, 2, 6, 7, 8, 12]
    assert starts_every_way(b"\n\n\n") == []


def test_no_final_line_break():
    assert starts_every_way(b"a,1\nb,2") == [0, 4]
    assert starts_every_way(b'a,1\n"b\n2"') == [0, 4]
    assert starts_every_way(b"a,1\n\r") == [0]                          # a last "row" of only \r is empty
    assert starts_every_way(b"a,1\n\r", skip_empty=False) == [0, 4]
    assert scan(b"a,1\nb,2", [4]) == ([0, 4], [0, 1], False)
    # planning keeps the bytes of the last row, which came in several blocks, the last of them only its \r
    settings = TextSettings.from_user("csv", {})
    assert scan_units(iter([b"h\nab", b"c", b"\r"]), settings, 64) == ([(2, 1, 1)], 6, False, False)


def test_empty_input():
    assert scan(b"") == ([], [], False)
    assert scan(b"", skip_empty=False) == ([], [], False)
    scanner = RowScanner(QUOTE, True)
    for _ in range(3):
        starts, lines = scanner.feed(b"")
        assert starts.dtype == lines.dtype == np.int64 and len(starts) == len(lines) == 0
    assert len(scanner.finish(b"")[0]) == 0 and scanner.row_start == 0
    settings = TextSettings.from_user("csv", {})
    assert scan_units(iter([]), settings, 4) == ([], 0, False, False)
    assert scan_units(iter([b""]), settings, 4) == ([], 0, False, False)
    assert row_starts(b"", settings).tolist() == []


def test_without_a_quote_character_quotes_are_plain_bytes():
    data = b'{"a": "x\\"y"}\n{"a": "\\""}\n"\n'
    assert starts_every_way(data, quote=None) == [0, 14, 26]
    assert scan(data, quote=None)[2] is False


def test_huge_fields_across_many_blocks():
    field = b'"' + b'x,""y""\n\r\n' * 20_000 + b'"'          # 200 KB, 40,000 quoted line breaks and quotes
    data = b"id,blob\n1," + field + b"\n2,short\n3," + field   # the last row huge and without a line break
    second = 10 + len(field) + 1
    expected = [0, 8, second, second + 8]
    for block in (1000, 4096, 65_536, 1 << 20):
        starts, lines, quoted = scan(data, block)
        assert (starts, quoted) == (expected, True)
        assert lines == [0, 1, 40_002, 40_003]
    settings = TextSettings.from_user("csv", {})        # the header is no row
    units, size, quoted, _ = scan_units(iter(blocks_of(data, 4096)), settings, 1 << 16)
    assert (size, quoted) == (len(data), True)
    assert units == [(8, 1, 1), (second, 2, 40_002)]    # (first start, rows, line breaks before) per unit


def test_a_unit_boundary_inside_a_quoted_line_break_keeps_the_row_in_its_first_unit():
    data = b'h\n1,"a\nb"\n2,"c\nd"\n3,e\n'
    settings = TextSettings.from_user("csv", {})
    inside = data.index(b"\nd") + 1                     # bytes [0, inside) are the first unit: it ends inside row 2
    for cut in range(1, len(data)):
        blocks = iter([data[:cut], data[cut:]])
        assert scan_units(blocks, settings, inside) == ([(2, 2, 1), (18, 1, 5)], len(data), True, False), f"cut at {cut}"


@pytest.mark.parametrize("skip_empty", [True, False])
def test_row_starts_is_a_scan_of_one_block(skip_empty):
    data = b'\r\n1,"a\r\n"\r\n\r\n2,b'
    settings = TextSettings.from_user("csv", {"ignore_empty_lines": skip_empty})
    assert row_starts(data, settings).tolist() == scan(data, skip_empty=skip_empty)[0]


# -- against Python's csv module ----------------------------------------------------------------------------------

FIELD = st.lists(st.sampled_from(["a", "é", " ", ",", '"', '""', "\n", "\r", "\r\n"]), max_size=5).map("".join)
ROW = st.lists(FIELD, min_size=0, max_size=4)            # a row of no fields is a blank line
ROWS = st.lists(ROW, max_size=12)


@st.composite
def csv_text(draw: st.DrawFn, rows: st.SearchStrategy[list[list[str]]] = ROWS) -> tuple[bytes, list[list[str]]]:
    """(CSV, its rows) as RFC 4180 writes them: a field with a comma, quote, \\r or \\n quoted (others at
    random), its quotes doubled; \\n or \\r\\n line ends, maybe none after the last row."""
    table = draw(rows)
    end = draw(st.sampled_from(["\n", "\r\n"]))
    text = ""
    for fields in table:
        cells = []
        for field in fields:
            quoted = fields == [""] or any(c in field for c in ',"\r\n') or draw(st.booleans())
            cells.append('"' + field.replace('"', '""') + '"' if quoted else field)
        text += ",".join(cells) + end
    if table and draw(st.booleans()):
        text = text.removesuffix(end)
        table = table[:-1] if table[-1] == [] else table    # a last blank line is then gone
    return text.encode(), table


def python_csv_rows(data: bytes) -> list[tuple[int, list[str]]]:
    """(byte offset, fields) of each row, by Python's csv module, fed lines that end at \\n only."""
    lines = data.split(b"\n")
    lines = [line + b"\n" for line in lines[:-1]] + ([lines[-1]] if lines[-1] else [])
    offsets = np.cumsum([0, *map(len, lines)]).tolist()
    reader = csv.reader(line.decode() for line in lines)
    out = []
    consumed = 0
    for fields in reader:
        out.append((offsets[consumed], fields))
        consumed = reader.line_num
    return out


@given(csv_text(), st.lists(st.integers(0, 200), max_size=8))
def test_row_starts_match_pythons_csv_module(written, cuts):
    data, rows = written
    parsed = python_csv_rows(data)
    assert [fields for _, fields in parsed] == rows
    starts, lines, quoted = scan(data, cuts, skip_empty=False)
    assert starts == [offset for offset, _ in parsed]
    assert lines == [data[:s].count(b"\n") for s in starts]
    # pyarrow and the scanner leave out blank lines (a row of no fields); a row of one empty field is written ""
    starts, _, _ = scan(data, cuts)
    assert starts == [offset for offset, fields in parsed if fields]
    assert quoted == any("\n" in f for r in rows for f in r)


@given(csv_text(st.lists(st.lists(FIELD, min_size=3, max_size=3), min_size=1, max_size=8)), st.integers(1, 50))
def test_row_starts_cut_rows_that_pyarrow_parses_alone(written, block):
    """Each stretch from one start to the next is one row to pyarrow, with the fields written."""
    data, rows = written
    starts, _, _ = scan(data, block)
    assert len(starts) == len(rows)
    options = (pa_csv.ReadOptions(column_names=["f0", "f1", "f2"], use_threads=False),   # as the reader parses
               pa_csv.ParseOptions(newlines_in_values=True),
               pa_csv.ConvertOptions(column_types=dict.fromkeys(["f0", "f1", "f2"], pa.string()),
                                     strings_can_be_null=False))
    for lo, hi, fields in zip(starts, [*starts[1:], len(data)], rows, strict=True):
        table = pa_csv.read_csv(io.BytesIO(data[lo:hi]), *options)
        assert table.num_rows == 1
        assert [table.column(i)[0].as_py() for i in range(3)] == fields


@given(csv_text(), st.integers(1, 64), st.lists(st.integers(0, 200), max_size=6))
def test_scan_units_buckets_the_row_starts(written, unit_bytes, cuts):
    data, _ = written
    settings = TextSettings.from_user("csv", {})
    starts = row_starts(data, settings).tolist()[settings.leading_rows:]
    units, size, _, _ = scan_units(iter(blocks_of(data, cuts)), settings, unit_bytes)
    assert size == len(data)
    expected: dict[int, list[int]] = {}
    for start in starts:
        expected.setdefault(start // unit_bytes, []).append(start)
    assert units == [(group[0], len(group), data[:group[0]].count(b"\n")) for _, group in sorted(expected.items())]
