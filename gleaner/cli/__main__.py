"""``python -m gleaner.cli``: the same as the ``gleaner`` console script."""

import sys

from gleaner.cli import main

sys.exit(main())
