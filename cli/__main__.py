"""`python -m cli`: the `agentrt` command from a checkout."""

import sys

from cli.main import main

sys.exit(main())
