"""``python -I -m agentcall.confine``: see :mod:`agentcall.confine.main`."""

import sys

from agentcall.confine.main import main

sys.exit(main(new_session=True))
