"""The bench site's shapes by name: ``tree`` (the default) and ``realistic``.

A spec travels to the site's server processes as JSON (``to_wire``); ``from_wire`` and
``generate`` turn it back into the same spec and the same drawn site on either side.
"""

from __future__ import annotations

from typing import Any

import orjson

from tests.support.site import realistic, tree
from tests.support.site.model import Site

__all__ = ["SHAPES", "BenchSpec", "from_wire", "generate", "shape", "to_wire"]

BenchSpec = tree.SiteSpec | realistic.RealisticSpec
SHAPES: dict[str, type[tree.SiteSpec] | type[realistic.RealisticSpec]] = {
    "tree": tree.SiteSpec,
    "realistic": realistic.RealisticSpec,
}


def shape(spec: BenchSpec) -> str:
    return "realistic" if isinstance(spec, realistic.RealisticSpec) else "tree"


def to_wire(spec: BenchSpec) -> str:
    return orjson.dumps({"shape": shape(spec), **spec.to_dict()}).decode()


def from_wire(text: str) -> BenchSpec:
    data: dict[str, Any] = orjson.loads(text)
    name = data.pop("shape", "tree")
    if name not in SHAPES:
        raise ValueError(f"unknown site shape {name!r} (one of {', '.join(SHAPES)})")
    return SHAPES[name](**data)


def generate(spec: BenchSpec) -> Site:
    if isinstance(spec, realistic.RealisticSpec):
        return realistic.generate(spec)
    return tree.generate(spec)
