"""How a job's pages are fetched: rendering, proxies, the User-Agent and what a soft block does.

A job spec carries it as its ``fetch`` section (``FetchPolicy.from_doc(doc, "fetch")``, strict:
an unknown field or a bad value is a ``SpecError`` naming the field); until a job says otherwise
every job gets ``FetchPolicy.from_settings(settings)``. Proxy URLs may name their credentials
as ``${VARIABLE}`` references (``http://crawler:${PROXY_PASSWORD}@proxy:3128``), which the
worker and the renderer resolve from their own environment: a policy holds no secret, so it can
be stored, shown and logged.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit

from jetcrawl.contract.errors import SettingsError, SpecError

__all__ = [
    "BLOCK_ACTIONS",
    "PROXY_SCHEMES",
    "RENDER_MODES",
    "ROTATIONS",
    "FetchPolicy",
    "check_proxy_url",
]

RENDER_NEVER: Final = "never"
RENDER_AUTO: Final = "auto"  # rendered when the served HTML looks like a script shell
RENDER_ALWAYS: Final = "always"
RENDER_MODES = (RENDER_NEVER, RENDER_AUTO, RENDER_ALWAYS)
ROTATIONS = ("sticky", "round_robin")  # sticky: one proxy per host while it is healthy
# What a soft block (a bot wall, CAPTCHA or login wall served as 200) does: recorded as such,
# retried later, or fetched again through the next proxy, or rendered in a browser.
BLOCK_ACTIONS = ("record", "retry", "proxy", "render")
PROXY_SCHEMES = ("http", "https", "socks5")  # socks5: aiohttp-socks (worker/socks.py)
_ENV_REF = re.compile(r"\$\{[A-Za-z_][A-Za-z0-9_]*\}")


@dataclass(frozen=True, slots=True)
class FetchPolicy:
    render: str = RENDER_NEVER  # never | auto | always
    user_agent: str | None = None  # None: the worker's (settings.user_agent)
    proxies: tuple[str, ...] = ()  # http:// or https:// proxy URLs; none: direct
    proxy_rotation: str = "sticky"
    on_block: str = "record"

    @property
    def may_render(self) -> bool:
        """Whether pages of this policy may need a renderer."""
        return self.render != RENDER_NEVER or self.on_block == "render"

    @classmethod
    def from_doc(cls, doc: object, path: str = "fetch") -> FetchPolicy:
        """A job spec's ``fetch`` section, checked field by field."""
        if not isinstance(doc, Mapping):
            raise SpecError(path, f"must be an object, got {type(doc).__name__}")
        known = {"render", "user_agent", "proxies", "proxy_rotation", "on_block"}
        for key in doc:
            if key not in known:
                raise SpecError(
                    f"{path}.{key}", f"unknown field (known: {', '.join(sorted(known))})"
                )
        render = _choice(doc, "render", RENDER_MODES, path, RENDER_NEVER)
        rotation = _choice(doc, "proxy_rotation", ROTATIONS, path, "sticky")
        on_block = _choice(doc, "on_block", BLOCK_ACTIONS, path, "record")
        user_agent = doc.get("user_agent")
        if user_agent is not None and (not isinstance(user_agent, str) or not user_agent.strip()):
            raise SpecError(f"{path}.user_agent", "must be a non-empty string")
        proxies = doc.get("proxies", [])
        if not isinstance(proxies, list) or not all(isinstance(p, str) for p in proxies):
            raise SpecError(f"{path}.proxies", "must be a list of proxy URLs")
        for n, url in enumerate(proxies):
            problem = check_proxy_url(url)
            if problem is not None:
                raise SpecError(f"{path}.proxies[{n}]", problem)
        if on_block == "proxy" and not proxies:
            raise SpecError(f"{path}.on_block", "'proxy' needs a list of proxies")
        return cls(render, user_agent, tuple(proxies), rotation, on_block)

    @classmethod
    def from_settings(cls, settings: Any) -> FetchPolicy:
        """The policy of every job that has none of its own: the settings' (``render``,
        ``proxies``, ``proxy_rotation``, ``on_block``); the User-Agent is the worker's."""
        doc = {
            "render": settings.render,
            "proxies": list(settings.proxies),
            "proxy_rotation": settings.proxy_rotation,
            "on_block": settings.on_block,
        }
        try:
            return cls.from_doc(doc, "settings")
        except SpecError as e:
            raise SettingsError(e.path.removeprefix("settings."), e.problem) from None

    def to_doc(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "render": self.render,
            "proxies": list(self.proxies),
            "proxy_rotation": self.proxy_rotation,
            "on_block": self.on_block,
        }
        if self.user_agent is not None:
            doc["user_agent"] = self.user_agent
        return doc


def check_proxy_url(url: str) -> str | None:
    """What is wrong with a proxy URL, or None. Credentials must be ``${VARIABLE}`` references:
    a password written into a policy would be stored and shown with it."""
    try:
        parts = urlsplit(url)
        _ = parts.port  # raises ValueError on a bad port
    except ValueError as e:
        return f"not a URL: {e}"
    if parts.scheme not in PROXY_SCHEMES:
        return f"scheme must be one of {', '.join(PROXY_SCHEMES)}, got {parts.scheme!r}"
    if not parts.hostname:
        return "has no host"
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        return "must be scheme://[user:password@]host:port only"
    if parts.password is not None and not _ENV_REF.fullmatch(parts.password):
        return "a password must be a ${VARIABLE} reference, resolved from the environment"
    return None


def _choice(
    doc: Mapping[str, Any], key: str, choices: tuple[str, ...], path: str, default: str
) -> str:
    value = doc.get(key, default)
    if value not in choices:
        raise SpecError(f"{path}.{key}", f"must be one of {', '.join(choices)}, got {value!r}")
    return str(value)
