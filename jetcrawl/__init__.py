"""jetcrawl: the shared contract (messages, topology, URL rules, settings) and the CLI."""

from jetcrawl.errors import JetcrawlError
from jetcrawl.settings import Settings

__version__ = "0.1.0"
PROTOCOL_VERSION = 1

__all__ = ["PROTOCOL_VERSION", "JetcrawlError", "Settings", "__version__"]
