"""An HTML page as a test reads it: its tags, what it would fetch (src=, href=, ...), its CSS
and titles (the performance report and task-stream figures, client/report.py)."""

from __future__ import annotations

from html.parser import HTMLParser

# Attributes through which a page fetches something.
FETCHING = {"src", "href", "srcset", "action", "data", "poster", "xlink:href", "formaction", "background"}


class ReportPage(HTMLParser):
    def __init__(self, text: str):
        super().__init__()
        self.tags: list[str] = []
        self.fetches: list[tuple[str, str, str]] = []
        self.styles: list[str] = []
        self.titles: list[str] = []
        self._in: list[str] = []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self._in.append(tag)
        for name, value in attrs:
            if name in FETCHING:
                self.fetches.append((tag, name, value or ""))
            if name == "style":
                self.styles.append(value or "")

    def handle_endtag(self, tag):
        if tag in self._in:
            del self._in[len(self._in) - 1 - self._in[::-1].index(tag):]

    def handle_data(self, data):
        if self._in and self._in[-1] == "style":
            self.styles.append(data)
        if self._in and self._in[-1] == "title":
            self.titles.append(data)
