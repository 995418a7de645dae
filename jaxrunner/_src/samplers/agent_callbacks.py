"""Runner hooks per env episode (as ``Callbacks``) and per agent episode (either kind of
env: a single-agent env's one agent), and the joining of agent episodes that span
samples (shared by the hooks and ``EnvRunner.sample_episodes`` on a multi-agent env)."""

from __future__ import annotations

from collections.abc import Sequence

from jaxrunner._src.core.episode import AgentEpisode, concatenate_agent_episodes
from jaxrunner._src.core.runner_state import EpisodeJoiner, Runner
from jaxrunner._src.samplers.callbacks import Callbacks

STEP_HOOKS = ("on_episode_start", "on_episode_step", "on_episode_end")
"""The hooks that run in the sampling loop, per env episode."""


class AgentCallbacks(Callbacks):
    """Subclass and override the hooks you need (``EnvRunner(...,
    callbacks=...)``). Hooks you do not override cost nothing; they run on the host.

    ``on_episode_start``, ``on_episode_step`` and ``on_episode_end`` are
    :class:`~jaxrunner.Callbacks`' hooks, per env episode, in the sampling loop (lockstep
    backends): the :class:`~jaxrunner.LiveEpisode`'s ``reward`` is the env's (summed over
    agents), ``infos`` the env's per-agent infos, ``terminated`` set where the env's
    episode ended; its ``obs`` (the first observations, then each step's ``next_obs``),
    ``action`` and ``extras`` are dicts by policy id of the agent slots' rows,
    ``[A_g, ...]``, zero where an agent has no transition (the trajectory's ``valid``).
    ``on_agent_episode_end`` runs after each ``sample()``, on every backend and on either
    kind of env (a single-agent env's episodes as its one agent's, ``agent_0`` of the
    default policy).
    """

    def on_agent_episode_end(self, runner: Runner, episode: AgentEpisode) -> None:
        """Once per complete agent episode (every transition, from its first to the one
        that ended it, joined across samples): after each ``sample()``, those that
        completed in it, by env episode id, then agent; those cut by a failure of their
        env (a restart) end there, ``episode.faulty``. On a single-agent env: each
        complete :class:`~jaxrunner.Episode` (its arrays and flags) as the
        ``AgentEpisode`` of agent ``"agent_0"`` of ``"default_policy"``, ``env_step`` its
        steps."""


def overrides(callbacks: Callbacks | None, hook: str) -> bool:
    """Whether ``callbacks`` overrides ``hook`` (else it is never called)."""
    base = AgentCallbacks  # (a plain Callbacks subclass: the same hooks)
    return callbacks is not None and getattr(type(callbacks), hook) is not getattr(base, hook)


def agent_episode_joiner(possible_agents: Sequence[str]) -> EpisodeJoiner[AgentEpisode]:
    """Joins agent episodes across samples: one stream per agent and env, complete
    episodes by env episode id, then the env's agent order."""
    rank = {agent: k for k, agent in enumerate(possible_agents)}
    return EpisodeJoiner(
        key=lambda e: (e.agent_id, e.env_id),
        concatenate=concatenate_agent_episodes,
        order=lambda e: (e.episode_id, rank[e.agent_id]),
    )
