"""What the tests stand on, besides the fixtures in ``tests/conftest.py``.

certs     a test CA with server and client certificates as PEM files (trustme)
badsite   a misbehaving local website (slow, dropped, partial, bombs, robots variants)
plugins   test plugins as a real distribution with entry points, on sys.path for one test
exampleplugin  the example plugin package installed into the test venv (fast when it is)
jssite    a website whose links only JavaScript writes (the render tests)
proxy     a local HTTP forward proxy recording what it carried (the proxy tests)
socks     a local SOCKS5 proxy recording where it was asked to connect (the proxy tests)
forking   ``python -m tests.support.forking``: the local crawl's forks, in a fresh interpreter
ledger    the fault tests' oracle: every admitted URL ends in exactly one result
mesh      dispatchers and workers as real processes against real servers
netns     network namespaces on a bridge, each process on its own address; links cut and healed
otlp      a local OTLP/HTTP receiver standing in for Jaeger
procfs    what Linux /proc says of a process
prometheus  a real Prometheus scraping given ports, answering PromQL over its HTTP API
scrape    Prometheus scrapes and probes of the services' metrics and health ports
site      a local multi-host website drawn from a seed, with the exact answer of its crawl
shop      a shop-like website, its job spec and the golden items of its extraction
streams   reading JetStream state: stored messages, seen keys, waiting on a count
tools     programs some tests run (promtool, prometheus, kubectl): skip without, fail on CI
urlcorpus a large URL corpus (site links, WHATWG inputs, generated); writes the golden file
faulty    ``python -m tests.support.faulty``: a real service that crashes at a chosen moment
postgres  a real PostgreSQL server (initdb + postgres in a temp dir), stopped and started at will
sinks     items made and published, sink consumers settled, ``jetcrawl sink`` as a process
"""
