"""Episodes to and from Minari datasets (``pip install "jaxrunner[minari]"``). See
docs/evaluation-and-datasets.md."""

from jaxrunner._src.services.datasets.reader import from_minari as from_minari
from jaxrunner._src.services.datasets.writer import to_minari as to_minari
