"""``python -m jax_ext.bench``: the same as the ``jax-ext-bench`` command."""
import sys

from .cli import main

sys.exit(main())
