"""``python -m memsave {info,demo,bench,estimate}``: see :mod:`memsave.cli`."""

import sys

from memsave.cli import main

sys.exit(main())
