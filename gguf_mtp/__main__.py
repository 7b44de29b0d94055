"""``python -m gguf_mtp``."""

import sys

from .cli import main

sys.exit(main())
