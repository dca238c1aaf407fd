"""``python -m ckptplan ARGS``: the same as the ``ckptplan`` command."""
import sys

from .cli import main

sys.exit(main())
