"""``python -m jaxrunner.bench``: a benchmark child process (see ``child.py``)."""

from jaxrunner.bench.child import main

# Under the guard: the process backend's workers import this module again.
if __name__ == "__main__":
    main()
