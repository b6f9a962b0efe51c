"""The synthetic multi-host website, one for the tests and the benchmark, with its exact crawl.

model    URLs before ports (``Loc``), what answers them (``Entry``), the renderer of every
         response and the BFS answer of a correct crawl (``Site``, ``Expected``)
tree     the benchmark's shape: many hosts, pages of ~5 KB, ~30 links each, every root a seed
realistic the bench's other shape: pages of 5-200 KB, binaries of real types and sizes,
         tracking and session parameters, redirect chains, 404s, one slow host
shapes   the bench's shapes by name (``--site tree|realistic``), to and from their JSON
levels   the tests' shape: small hosts whose link depths do not depend on crawl order
served   ``MultiHostSite``: the levelled site served in-process by aiohttp, with a request log,
         and the reference reading of URLs and links (``canonical``, ``extract_links``)

The benchmark serves ``tree`` and ``realistic`` sites from processes of its own
(``bench.siteserver``), which answer from the same ``Site.responses``. It lives here rather than
in bench/ because the tests' fixtures are its first users and bench/ only measures.
"""

from tests.support.site.model import DISALLOWED_PREFIX, ROBOTS_TXT, TRACKING_PARAMS, Expected, Loc
from tests.support.site.served import MultiHostSite, SiteRequest, canonical, extract_links

__all__ = [
    "DISALLOWED_PREFIX",
    "ROBOTS_TXT",
    "TRACKING_PARAMS",
    "Expected",
    "Loc",
    "MultiHostSite",
    "SiteRequest",
    "canonical",
    "extract_links",
]
