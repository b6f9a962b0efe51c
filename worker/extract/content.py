"""A page's main content (no menus, footers or ads) as markdown or plain text, by trafilatura.

trafilatura (with lxml and its fallbacks) is the optional extra ``markdown``: a job that asks for
content is refused at ``compile_extraction`` when it is not installed, not on the first page.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable
from typing import Any

from jetcrawl.contract.errors import SpecError
from jetcrawl.worker.extract.spec import ContentFormat

__all__ = ["main_content", "require_content"]

_OUTPUT_FORMAT = {"markdown": "markdown", "text": "txt"}


def require_content(path: str) -> None:
    """Refuse a rule's ``content`` at ``path`` when trafilatura is not installed."""
    if importlib.util.find_spec("trafilatura") is None:
        raise SpecError(
            path, "main content needs trafilatura: pip install 'jetcrawl[markdown]' on the workers"
        )


def main_content(html: str, url: str, output: ContentFormat) -> str | None:
    """The main content of ``html`` in ``output`` format; None where trafilatura finds none."""
    content = _trafilatura()(
        html, url=url, output_format=_OUTPUT_FORMAT[output], include_comments=False
    )
    return content if isinstance(content, str) else None


@functools.cache
def _trafilatura() -> Callable[..., Any]:
    # Imported on first use: it is an optional extra, and its import costs a worker ~0.8 s.
    from trafilatura import extract

    return extract
