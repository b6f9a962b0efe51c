"""Operator commands over a running mesh.

status.py     ``jetcrawl status``: workers, shards, backlogs, hand-backs, rates
jobstatus.py  what status shows of jobs: backlog per lane, run states, ``--job NAME``
results.py    ``jetcrawl results``: read and filter the results stream
dlq.py        ``jetcrawl dlq``: list and replay dead letters
jobs.py       ``jetcrawl job``: put, get, list and diff job specs
control.py    ``jetcrawl job pause|resume|cancel``: a job's run state; cancel purges its tasks
export.py     result records as JSONL, CSV or WARC
items.py      ``jetcrawl results --items``: items as JSONL, CSV or Parquet
"""

__all__: list[str] = []  # import the modules by name
