"""The terminal's tables: they fit 80 columns, and no number or header is ever cut."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

# Tables fit 80 columns: no vertical rules, numbers and headers never wrapped or cut (only text
# cells wrap); the columns a reader needs first by default, the rest with --wide.
TABLE_STYLE: dict[str, Any] = dict(
    box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, padding=(0, 1), collapse_padding=True
)


def number_column(table: Table, header: str, **kw: Any) -> None:
    """A column of numbers: right-aligned, never wrapped, as wide as its widest cell."""
    table.add_column(header, justify="right", no_wrap=True, **kw)


def print_table(console: Console, table: Table) -> None:
    """``table`` at the console's width, or wider where its numbers need it (--wide on a
    narrow terminal): a line the terminal wraps, never a number cut."""
    if table.title:  # a line of its own, wrapped at the terminal's width, not the table's
        console.print(table.title, style="table.title", highlight=False)
        table.title = None
    need = _least_width(table)
    if need > console.width:
        table.width = need  # rich then lays it out wider than the console
    console.print(table, crop=False)


def _least_width(table: Table) -> int:
    """The narrowest ``table`` can be without cutting a number: its number columns whole, its
    text columns at their least width, the gaps between columns (two spaces each)."""
    widths = []
    for col in table.columns:
        if not col.no_wrap:
            widths.append(col.min_width or 1)
            continue
        cells = [col.header, *col._cells]
        widths.append(max(_cell_width(c) for c in cells))
    return sum(widths) + 2 * (len(widths) - 1)


def _cell_width(cell: Any) -> int:
    text = Text.from_markup(cell) if isinstance(cell, str) else cell
    if not isinstance(text, Text):
        return 1
    return max((cell_len(line) for line in text.plain.splitlines()), default=0)


def text_column(table: Table, header: str, min_width: int = 8) -> None:
    """A column of words (names, notes): the one that wraps when the line is short."""
    table.add_column(header, justify="left", overflow="fold", min_width=min_width)
