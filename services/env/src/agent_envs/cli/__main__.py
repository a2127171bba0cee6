"""``python -m agent_envs.cli ...``: the ``agent-envs`` command without its console script."""

import sys

from .main import main

sys.exit(main())
