"""Sphinx configuration for the jax_ext documentation.

Sphinx + MyST + autodoc/napoleon, the tool chain jax and its extensions (jax-finufft,
mpi4jax) use; the API reference is generated from the Google-style docstrings.
Build: ``python -m sphinx -W -b html docs docs/_build`` (needs the ``docs`` extra and an
importable ``jax_ext``).
"""
from __future__ import annotations

import jax_ext

project = "jax_ext"
author = "the jax_ext authors"
copyright = "the jax_ext authors"
release = version = jax_ext.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
# Fragments included into other pages are not pages of their own.
exclude_patterns = ["_build", "_generated", "_auto_cost_model.md"]

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
# Lets napoleon escape the trailing underscore of `else_` (an RST reference otherwise).
strip_signature_backslash = True
autodoc_member_order = "bysource"
# Signatures without annotations (jax.typing.ArrayLike expands to a long Union); each
# docstring's Args section gives every argument's type, shape and dtype.
autodoc_typehints = "none"

html_theme = "furo"
html_title = f"jax_ext {release}"
