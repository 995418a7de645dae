"""Sphinx configuration of jaxrunner's documentation site (MyST Markdown, furo)."""

import os
import sys

# The docs describe the checkout they live in, not an installed copy.
sys.path.insert(0, os.path.abspath(".."))
# Local extensions (the performance page's results tables and figures) live in docs/_ext.
sys.path.insert(0, os.path.abspath("_ext"))

project = "jaxrunner"
author = "jaxrunner contributors"
copyright = "jaxrunner contributors"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "results_tables",  # docs/_ext: the performance page's tables
    "results_figures",  # and its figures
]

source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_ext", "Thumbs.db", ".DS_Store"]

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

html_theme = "furo"
html_title = "jaxrunner"

# Docstrings are Google style ("Args:", "Returns:").
napoleon_google_docstring = True
napoleon_numpy_docstring = False
# "Attributes:" as fields of the class, not a second description of each attribute.
napoleon_use_ivar = True
# A field name such as ``reward`` links to whichever class documents one; where several
# do (BatchStep, GroupBuffers), the link is ambiguous but harmless: no warning for it.
suppress_warnings = ["ref.python"]
autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_member_order = "bysource"
autodoc_typehints = "description"
# Optional extras the serving API imports: mocked, so the reference builds with or without them.
autodoc_mock_imports = ["fastapi", "uvicorn", "h11", "httpx", "starlette", "pydantic"]
