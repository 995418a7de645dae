"""``python -m jaxrunner._src.bench``: a benchmark child process (see ``child.py``)."""

from jaxrunner._src.bench.child import main

# Under the guard: the process backend's workers import this module again.
if __name__ == "__main__":
    main()
