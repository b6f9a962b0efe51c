"""The contract between the services: what every one of them agrees on, importing nothing else.

errors.py     the exception tree (``JetcrawlError`` and its branches)
settings.py   the one frozen ``Settings`` object, from flags and ``JETCRAWL_*`` variables
messages.py   wire shapes and their frozen dataclasses (seeds, tasks, results, dead letters)
topology.py   streams, consumers and buckets as code; subjects (declared: plumbing applies them)
urls.py       canonical URLs, scope, the shard function and the URL fingerprint
jobs.py       job specs: link rules, filters, limits, extraction, plugins, priority; read strictly
control.py    a job's run state: running, paused or cancelled
filetypes.py  links skipped by extension (by default, Scrapy's list) and bodies by media type
"""

# The mesh's protocol, in the tasks stream's metadata and worker records; 2: tasks on lanes.
PROTOCOL_VERSION = 2

__all__ = ["PROTOCOL_VERSION"]
