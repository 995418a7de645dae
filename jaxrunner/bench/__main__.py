"""``python -m jaxrunner.bench``: a benchmark child process (see ``child.py``)."""

from jaxrunner.bench.child import main

main()
