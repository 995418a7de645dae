import sys

from jaxrunner._src.cli import main

sys.exit(main())
