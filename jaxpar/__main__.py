"""``python -m jaxpar demo``."""

import sys

from .cli import main

sys.exit(main())
