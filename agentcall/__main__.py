import sys

from agentcall.cli.main import main

sys.exit(main())
