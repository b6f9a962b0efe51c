"""``python -m tests.support.shop``: write golden.jsonl anew from the engine's current output."""

import asyncio

import orjson

from tests.support.exampleplugin import ensure_installed
from tests.support.shop.golden import GOLDEN, fetch_pages, item_lines, run_job
from tests.support.shop.served import ShopSite


async def write() -> None:
    ensure_installed()
    async with ShopSite() as shop:
        lines = item_lines(run_job(await fetch_pages(shop)), shop.base_url)
    GOLDEN.write_bytes(
        b"".join(orjson.dumps(line, option=orjson.OPT_SORT_KEYS) + b"\n" for line in lines)
    )
    print(f"wrote {len(lines)} items to {GOLDEN}")


asyncio.run(write())
