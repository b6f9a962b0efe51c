"""Writing results out: JSON lines, or WARC 1.1 with warcio.

WARC: one ``warcinfo`` record, then per fetched URL a ``request`` record (the GET we sent) and a
``response`` record (status line, the headers we kept, the body) bound by
``WARC-Concurrent-To``. The body comes from the ``crawl_bodies`` store, so it is exact only when
the crawl kept bodies (``store_bodies``); a response whose body was not kept (bodies off, or not
HTML, which the worker never reads) is written with its headers and ``WARC-Truncated: length``,
the WARC way to say the payload is incomplete. Records without an HTTP response (robots denials,
failures) have no WARC form and are counted as skipped.
"""

from __future__ import annotations

import datetime as dt
import http
from io import BytesIO
from pathlib import Path
from typing import IO, Protocol
from urllib.parse import urlsplit

from warcio.recordloader import ArcWarcRecord
from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

from jetcrawl import __version__
from jetcrawl.contract.errors import JetcrawlError
from jetcrawl.contract.messages import Result

FORMATS = ("jsonl", "warc")
# Headers that described the transfer, not the payload we kept (decoded, whole).
TRANSFER_HEADERS = frozenset({"content-encoding", "content-length", "transfer-encoding"})


class ExportError(JetcrawlError):
    """The output cannot be written as asked."""


class Sink(Protocol):
    needs_bodies: bool
    needs_records: bool  # write() reads ``result``; without, ``raw`` is all and result may be None
    written: int
    skipped: int

    def write(self, result: Result | None, raw: bytes, body: bytes | None) -> None: ...

    def flush(self) -> None:
        """What was written reaches the file (a reader of a running crawl's output sees it)."""

    def close(self) -> None: ...


def format_for(path: Path | None, explicit: str | None = None) -> str:
    """The format asked for, or the one the file name says (``.warc``, ``.warc.gz``: WARC)."""
    if explicit is not None:
        if explicit not in FORMATS:
            raise ExportError(f"unknown format {explicit!r}; use one of {FORMATS}")
        return explicit
    if path is not None and (path.name.endswith(".warc") or path.name.endswith(".warc.gz")):
        return "warc"
    return "jsonl"


def open_sink(stream: IO[bytes], fmt: str, gzip: bool, user_agent: str) -> Sink:
    if fmt == "warc":
        return WarcSink(stream, gzip=gzip, user_agent=user_agent)
    return JsonlSink(stream)


class JsonlSink:
    needs_bodies = False
    needs_records = False

    def __init__(self, stream: IO[bytes]) -> None:
        self._stream = stream
        self.written = 0
        self.skipped = 0

    def write(self, result: Result | None, raw: bytes, body: bytes | None) -> None:
        self._stream.write(raw.rstrip(b"\n") + b"\n")
        self.written += 1

    def flush(self) -> None:
        self._stream.flush()

    def close(self) -> None:
        self._stream.flush()


class WarcSink:
    needs_bodies = True
    needs_records = True

    def __init__(self, stream: IO[bytes], *, gzip: bool, user_agent: str) -> None:
        self._writer = WARCWriter(stream, gzip=gzip, warc_version="1.1")
        self._user_agent = user_agent
        self.written = 0
        self.skipped = 0
        info = self._writer.create_warcinfo_record(
            getattr(stream, "name", "") if isinstance(getattr(stream, "name", ""), str) else "",
            {
                "software": f"jetcrawl/{__version__}",
                "format": "WARC File Format 1.1",
                "http-header-user-agent": user_agent,
            },
        )
        self._writer.write_record(info)

    def write(self, result: Result | None, raw: bytes, body: bytes | None) -> None:
        if result is None:
            raise ValueError("WarcSink.write needs the decoded result")
        if result.outcome != "fetched" or result.status is None:
            self.skipped += 1
            return
        date = _warc_date(result.fetched_at)
        request = self._writer.create_warc_record(
            result.url,
            "request",
            http_headers=self._request_headers(result.url),
            warc_headers_dict={"WARC-Date": date},
        )
        response = self._response(result, body, date)
        response.rec_headers.add_header(
            "WARC-Concurrent-To", request.rec_headers.get_header("WARC-Record-ID")
        )
        self._writer.write_record(request)
        self._writer.write_record(response)
        self.written += 1

    def flush(self) -> None:
        self._writer.out.flush()

    def close(self) -> None:
        self._writer.out.flush()

    def _request_headers(self, url: str) -> StatusAndHeaders:
        parts = urlsplit(url)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        headers = [("Host", parts.netloc), ("User-Agent", self._user_agent), ("Accept", "*/*")]
        return StatusAndHeaders(f"GET {target} HTTP/1.1", headers, is_http_request=True)

    def _response(self, result: Result, body: bytes | None, date: str) -> ArcWarcRecord:
        status = result.status or 0
        try:
            reason = http.HTTPStatus(status).phrase
        except ValueError:
            reason = "Unknown"
        headers = [
            (name.title(), value)
            for name, value in result.headers.items()
            if name.lower() not in TRANSFER_HEADERS
        ]
        payload = body or b""
        headers.append(("Content-Length", str(len(payload))))
        warc_headers = {"WARC-Date": date}
        if body is None and result.length > 0:
            warc_headers["WARC-Truncated"] = "length"
        return self._writer.create_warc_record(
            result.url,
            "response",
            payload=BytesIO(payload),
            length=len(payload),
            http_headers=StatusAndHeaders(f"{status} {reason}", headers, protocol="HTTP/1.1"),
            warc_headers_dict=warc_headers,
        )


def _warc_date(epoch: float) -> str:
    when = dt.datetime.fromtimestamp(epoch, dt.UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond:06d}Z"
