"""PettingZoo's base classes for the test envs and fault wrappers, or stand-ins where
PettingZoo (an optional extra) is not installed: ``jaxrunner.testing`` then refuses its
multi-agent names (:data:`HAVE_PETTINGZOO`)."""

try:
    from pettingzoo import AECEnv, ParallelEnv
    from pettingzoo.utils.wrappers import BaseParallelWrapper, BaseWrapper

    HAVE_PETTINGZOO = True
except ImportError:  # the gymnasium half of jaxrunner.testing works without it
    AECEnv = ParallelEnv = BaseParallelWrapper = BaseWrapper = object  # type: ignore[assignment,misc]
    HAVE_PETTINGZOO = False
