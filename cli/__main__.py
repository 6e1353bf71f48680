"""``python -m cli``: the same as the ``gleaner`` console script."""

import sys

from cli import main

sys.exit(main())
