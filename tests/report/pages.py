"""Reading a report page back: its sections in order, tables, images, links and the texts of
elements by class, with the standard library's HTML parser (what a browser would build)."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from html.parser import HTMLParser


@dataclass
class Page:
    sections: list[str] = field(default_factory=list)  # the ids of <section>, in order
    tables: list[list[list[str]]] = field(default_factory=list)  # rows of cells (th and td)
    urls: list[tuple[str, str, str]] = field(default_factory=list)  # (tag, attribute, value)
    tags: set[str] = field(default_factory=set)
    by_class: dict[str, list[str]] = field(default_factory=dict)  # class → texts, in order
    text_of: dict[str, str] = field(default_factory=dict)  # section id → its text


class _Reader(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.page = Page()
        self.open: list[tuple[str, str | None]] = []  # (tag, class) of elements open
        self.texts: list[list[str]] = []  # text of each open element that has a class
        self.section: str | None = None
        self.row: list[str] | None = None
        self.cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.page.tags.add(tag)
        self._gap()
        for name in ("src", "href", "action", "data", "poster"):
            if a.get(name):
                self.page.urls.append((tag, name, a[name]))
        if tag == "section":
            self.section = a.get("id", "")
            self.page.sections.append(self.section)
            self.page.text_of[self.section] = ""
        if tag == "table":
            self.page.tables.append([])
        if tag == "tr":
            self.row = []
        if tag in ("td", "th"):
            self.cell = []
        if tag in ("img", "meta", "br", "link", "hr", "input"):
            return  # void elements: nothing to close
        self.open.append((tag, a.get("class")))
        self.texts.append([])

    def _gap(self) -> None:
        """Elements apart are words apart in a section's text (a dt and its dd)."""
        if self.section is not None:
            self.page.text_of[self.section] += " "

    def handle_endtag(self, tag):
        self._gap()
        if tag in ("td", "th") and self.row is not None and self.cell is not None:
            self.row.append(" ".join("".join(self.cell).split()))
            self.cell = None
        if tag == "tr" and self.row is not None:
            self.page.tables[-1].append(self.row)
            self.row = None
        if tag == "section":
            self.section = None
        while self.open:
            (t, cls), text = self.open.pop(), self.texts.pop()
            if cls:
                for c in cls.split():
                    self.page.by_class.setdefault(c, []).append(" ".join("".join(text).split()))
            if t == tag:
                break

    def handle_data(self, data):
        for t in self.texts:
            t.append(data)
        if self.cell is not None:
            self.cell.append(data)
        if self.section is not None:
            self.page.text_of[self.section] += data


def read_page(text: str) -> Page:
    reader = _Reader()
    reader.feed(text)
    reader.close()
    return reader.page


def flat(text: str) -> str:
    return " ".join(text.split())


def read_csv(text: str) -> tuple[list[str], list[dict[str, str]]]:
    rows = list(csv.reader(io.StringIO(text)))
    return rows[0], [dict(zip(rows[0], r, strict=True)) for r in rows[1:]]


def md_table(text: str, first_heading: str) -> list[list[str]]:
    """The Markdown pipe table whose header row starts with ``first_heading``: its rows of cells
    (the header and the alignment row left out)."""
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(f"| {first_heading} |"))
    rows = []
    for ln in lines[start + 2 :]:
        if not ln.startswith("|"):
            break
        rows.append([c.strip() for c in ln.strip("|").split(" | ")])
    return rows
