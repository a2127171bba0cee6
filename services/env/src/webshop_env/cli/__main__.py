"""``python -m webshop_env.cli ...``: the ``webshop-env`` command without its console script."""

import sys

from .main import main

sys.exit(main())
