"""The contract between the services: what every one of them agrees on, importing nothing else.

errors.py     the exception tree (``JetcrawlError`` and its branches)
settings.py   the one frozen ``Settings`` object, from flags and ``JETCRAWL_*`` variables
messages.py   wire shapes and their frozen dataclasses (seeds, tasks, results, dead letters)
topology.py   streams, consumers and buckets as code; subjects (declared: plumbing applies them)
urls.py       canonical URLs, scope, the shard function and the URL fingerprint
jobs.py       job specs: link rules, filters, limits, extraction and plugins; read strictly
filetypes.py  links skipped by extension (by default, Scrapy's list) and bodies by media type
"""

PROTOCOL_VERSION = 1  # the mesh's protocol: in the tasks stream's metadata and worker records

__all__ = ["PROTOCOL_VERSION"]
