"""Episodes to and from Minari datasets (``pip install "jaxrunner[minari]"``).

Minari is the Farama Foundation's format for offline RL datasets (the successor of
D4RL): :func:`to_minari` writes :class:`~jaxrunner.Episode`\\ s as a dataset that
``minari.load_dataset`` opens, and :func:`from_minari` reads a Minari dataset back
as Episodes, trusting its files as data only (it never imports or calls what a dataset
names, unless told to by name) and refusing inconsistent episodes.

Per episode Minari stores ``L + 1`` observations (the reset observation to the true
final one), ``L`` actions, rewards and separate ``terminations`` / ``truncations``,
and the reset seed where it is known. jaxrunner's own fields travel in the
episode's ``infos`` (``L + 1`` rows, one per observation, as Minari's own collector
writes them): ``env_id`` and ``episode_id`` (the runner's), and under ``extras`` the
policy's outputs for the action taken at each observation (``log_prob``,
``value``, ...), zero in the final row, where no action was taken.
"""

from jaxrunner._src.services.datasets.reader import MAX_METADATA_BYTES, from_minari
from jaxrunner._src.services.datasets.writer import to_minari

__all__ = ["MAX_METADATA_BYTES", "from_minari", "to_minari"]
