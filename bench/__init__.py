"""The benchmark harness: jetcrawl against Scrapy and bare fetch loops on one synthetic site.

siteserver.py     the site (tests/support/site/tree.py, shared with the tests), served by
                  separate lean processes; request counts and crawl span
procs.py          CPU and RSS of a process tree from /proc; the environment of children
bare.py           baselines: aiohttp fetch loop over the known URLs, with/without extraction
scrapy_spider.py  Scrapy with equivalent settings and jetcrawl's canonical fingerprints
runners.py        one run of one system, and the check that it crawled the known set
ceiling.py        JetStream messages/s and nats-server CPU for jetcrawl's per-page mix
memory.py         dispatcher RSS while the seen set grows (``python -m bench memory``)
seen.py           the seen set: nats-server memory per key and per task; admissions/s and CPU
                  per URL with K=1 and K=3 partitions on a 3-node cluster (``python -m bench seen``)
cpulimit.py       a CPU budget for one process by a cgroup: each server's, in ``bench seen``
soak.py           dispatcher and worker RSS over a long re-crawl (``python -m bench soak-memory``)
extract.py        extraction's CPU per page beside Scrapy's (``python -m bench extract``)
render.py         renderer pages/s per core and RSS per browser (``python -m bench render``)
profile.py        py-spy recordings of jetcrawl's processes, summarized
urls.py           canonicalizers timed on one URL corpus (``python -m bench urls``)
report.py         medians, ranges, comparisons and targets as markdown and JSON
cli.py            ``python -m bench``
"""

__all__: list[str] = []
