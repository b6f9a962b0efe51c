"""What the tests stand on, besides the fixtures in ``tests/conftest.py``.

badsite   a misbehaving local website (slow, dropped, partial, bombs, robots variants)
jssite    a website whose links only JavaScript writes (the render tests)
proxy     a local HTTP forward proxy recording what it carried (the proxy tests)
socks     a local SOCKS5 proxy recording where it was asked to connect (the proxy tests)
forking   ``python -m tests.support.forking``: the local crawl's forks, in a fresh interpreter
ledger    the fault tests' oracle: every admitted URL ends in exactly one result
mesh      dispatchers and workers as real processes against real servers
otlp      a local OTLP/HTTP receiver standing in for Jaeger
procfs    what Linux /proc says of a process
prometheus  a real Prometheus scraping given ports, answering PromQL over its HTTP API
scrape    Prometheus scrapes and probes of the services' metrics and health ports
site      a local multi-host website drawn from a seed, with the exact answer of its crawl
streams   reading JetStream state: stored messages, seen keys, waiting on a count
tools     programs some tests run (promtool, prometheus, kubectl): skip without, fail on CI
faulty    ``python -m tests.support.faulty``: a real service that crashes at a chosen moment
"""
