"""``python -m agentcall.guard``: the form the listener puts into the agent's hook settings."""

import sys

from agentcall.guard.main import main

sys.exit(main())
