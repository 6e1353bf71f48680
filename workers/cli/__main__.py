"""``python -m workers.cli``: the same as the ``gleaner`` console script."""

import sys

from workers.cli import main

sys.exit(main())
