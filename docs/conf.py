"""Sphinx configuration: the guides in Markdown (MyST), the API reference from docstrings (autodoc)."""

import os
import sys

# drift from this checkout (src layout), whether or not it is installed.
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "src")))

project = "drift"
author = "the drift authors"
copyright = "the drift authors"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",  # the docstrings' "Args:", "Returns:" and "Raises:" sections
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
# Only the pages: what the build writes, results and anything else under docs/ that is not a page stay out.
exclude_patterns = ["_build", "results", "**/results", ".venv", "**/.ipynb_checkpoints"]

# GitHub's anchors for Markdown headings (README and the pages link to "#drift-trains-defaults" and the like).
myst_heading_anchors = 3

autodoc_member_order = "bysource"
autodoc_default_options = {"exclude-members": "extra_repr"}
autodoc_typehints = "signature"
autodoc_preserve_defaults = True
napoleon_google_docstring = True
napoleon_numpy_docstring = False

html_theme = "alabaster"
html_title = "drift"
