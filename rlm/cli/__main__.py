"""``python -m rlm.cli``: the same as the ``rlm`` command."""

import sys

from rlm.cli import main

sys.exit(main())
