"""``python -m jetcrawl`` is the ``jetcrawl`` command."""

import sys

from jetcrawl.cli import main

sys.exit(main())
