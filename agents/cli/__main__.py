"""``python -m agents.cli`` (and ``accelerate launch -m agents.cli``): the ``envace`` command."""

import sys

from agents.cli.main import main

sys.exit(main())
