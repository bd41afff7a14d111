"""``python -m agents.cli``: the ``bugfix-gym`` command."""

import sys

from agents.cli import main

sys.exit(main())
