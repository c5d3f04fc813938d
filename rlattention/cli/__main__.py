"""``python -m rlattention.cli``: the same as the ``rlattention`` command."""

import sys

from rlattention.cli import main

sys.exit(main())
