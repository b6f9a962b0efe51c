"""A local shop-like website for the job tests: categories, products, articles, and traps.

catalog  the shop's products, categories and articles, and every page rendered from them
served   ``ShopSite``: the shop served in-process by aiohttp on 127.0.0.30, with a request log
golden   the job spec (``job.yaml``) and the golden items (``golden.jsonl``) of its extraction
         and plugin over every page; ``python -m tests.support.shop`` rewrites the items
"""

from tests.support.shop.golden import (
    GOLDEN,
    JOB_SPEC,
    SITE,
    fetch_pages,
    golden_lines,
    item_lines,
    job_spec,
    placed,
    run_job,
)
from tests.support.shop.served import ShopSite

__all__ = [
    "GOLDEN",
    "JOB_SPEC",
    "SITE",
    "ShopSite",
    "fetch_pages",
    "golden_lines",
    "item_lines",
    "job_spec",
    "placed",
    "run_job",
]
