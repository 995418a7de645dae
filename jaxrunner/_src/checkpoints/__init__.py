"""Private: see the public modules of ``jaxrunner``."""
