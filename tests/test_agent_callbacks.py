"""``AgentCallbacks.on_agent_episode_end`` on a single-agent env: the env's one agent
(``agent_0`` of ``default_policy``), each complete episode once, as on a multi-agent env.
The multi-agent cases: tests/test_multi_agent_services.py."""

from __future__ import annotations

import functools

import gymnasium
import jax
import numpy as np
import pytest

import jaxrunner as jr
from jaxrunner._src.testing.jax_envs import RandomWalk, WalkParams
from jaxrunner.errors import InvalidArgumentError
from jaxrunner.models import mlp_policy
from jaxrunner.testing import FaultPlan, assert_trees_equal, faulty_env_fns

short_cartpole = functools.partial(gymnasium.make, "CartPole-v1", max_episode_steps=13)


class EpisodeEnds(jr.multi_agent.AgentCallbacks):
    """Each sample's agent episodes, in the order the hook saw them."""

    def __init__(self) -> None:
        self.by_sample: list[list[jr.AgentEpisode]] = [[]]

    def on_agent_episode_end(self, runner, episode) -> None:
        self.by_sample[-1].append(episode)


def host_envs(backend: str) -> jr.VectorEnv:
    if backend == "faulty":  # every sub-env fails at its 6th step call, and is recreated
        fns = faulty_env_fns(short_cartpole, 3, faults=[FaultPlan(at=(6,))])
        return jr.make_vec(fns, 3, restart_policy=jr.RestartPolicy())
    if backend == "ready_first":
        config = jr.ProcessConfig(num_workers=3, ready_first=True)
        return jr.make_vec(short_cartpole, 3, backend="process", config=config)
    return jr.make_vec(short_cartpole, 3, backend=backend)


def make_runner(backend: str, callbacks) -> jr.EnvRunner:
    if backend == "scan":
        envs = jr.JaxVectorEnv(RandomWalk(), WalkParams(max_steps_in_episode=9), 3)
    else:
        envs = host_envs(backend)
    policy = mlp_policy(envs.single_action_space, hidden=(8,))
    params = policy.init(jax.random.key(1), envs.single_observation_space)
    try:
        return jr.EnvRunner(envs, policy, params, 7, seed=2, callbacks=callbacks)
    except BaseException:
        envs.close()
        raise


@pytest.mark.parametrize("backend", ["sync", "process", "ready_first", "scan", "faulty"])
def test_each_episode_once_as_its_one_agent_after_the_sample_it_ends_in(backend):
    """After each sample: the episodes that completed in it (those begun in an earlier
    sample whole), by episode id, each the trajectory's Episode as agent_0's
    AgentEpisode, array for array; faulty-cut ones too."""
    callbacks = EpisodeEnds()
    trajs = []
    with make_runner(backend, callbacks) as runner:
        for _ in range(5):
            trajs.append(jax.device_get(runner.sample()))
            callbacks.by_sample.append([])
    seen = callbacks.by_sample[:-1]

    def complete(count: int) -> dict[int, jr.Episode]:  # in the first count samples
        joined = jr.concatenate(trajs[:count]).split_episodes() if count else []
        return {e.episode_id: e for e in joined if e.is_complete}

    spanning = faulty = 0
    for i, got in enumerate(seen):
        before, now = complete(i), complete(i + 1)
        want = [now[k] for k in sorted(set(now) - set(before))]
        continued = {e.episode_id for e in trajs[i].split_episodes() if e.start_step > 0}
        assert [e.episode_id for e in got] == [e.episode_id for e in want], f"sample {i}"
        for agent_episode, episode in zip(got, want):
            where = f"sample {i}, episode {episode.episode_id}"
            assert isinstance(agent_episode, jr.AgentEpisode), where
            assert (agent_episode.agent_id, agent_episode.policy_id) == (
                "agent_0",
                "default_policy",
            )
            for field in ("obs", "action", "reward", "extras"):
                assert_trees_equal(getattr(agent_episode, field), getattr(episode, field), where)
            np.testing.assert_array_equal(agent_episode.env_step, np.arange(episode.length))
            for field in ("terminated", "truncated", "start_step", "faulty", "env_id"):
                assert getattr(agent_episode, field) == getattr(episode, field), where
            spanning += episode.episode_id in continued
            faulty += episode.faulty
    assert sum(map(len, seen)) > 5 and spanning > 0
    assert (faulty > 0) == (backend == "faulty")


def test_the_hook_costs_nothing_where_it_is_not_overridden():
    """Callbacks without it (a plain Callbacks, an AgentCallbacks overriding nothing)
    leave it out: no episode is joined or converted after sample()."""

    class Steps(jr.Callbacks):
        def on_episode_step(self, runner, env_index, episode) -> None:
            pass

    for callbacks in (Steps(), jr.multi_agent.AgentCallbacks()):
        with make_runner("sync", callbacks) as runner:
            assert runner._on_agent_episode_end is None
            runner.sample()
            assert runner.state.callback_episodes.fragments == {}


@pytest.mark.parametrize("backend", ["ready_first", "scan"])
def test_where_per_step_hooks_cannot_run_only_the_agent_episode_hook_is_taken(backend):
    class Both(EpisodeEnds):
        def on_episode_end(self, runner, env_index, episode) -> None:
            pass

    for refused in (jr.Callbacks(), Both()):
        with pytest.raises(InvalidArgumentError, match="override only on_agent_episode_end"):
            make_runner(backend, refused)
    with make_runner(backend, EpisodeEnds()) as runner:  # the envs were freed
        runner.sample()


def test_a_raising_agent_episode_hook_keeps_the_sample_and_fails_the_runner():
    class Raises(jr.multi_agent.AgentCallbacks):
        def on_agent_episode_end(self, runner, episode) -> None:
            raise RuntimeError("boom")

    with make_runner("sync", Raises()) as runner:
        with pytest.raises(RuntimeError, match="boom") as info:
            for _ in range(5):  # until an episode ends
                runner.sample()
        assert info.value.partial_trajectory.num_steps == 7  # the whole sample
        with pytest.raises(jr.errors.RunnerFailedError):
            runner.sample()


def test_a_hook_that_cannot_take_its_arguments_is_refused_when_the_runner_is_built():
    class NoEnvIndex(jr.Callbacks):
        def on_episode_end(self, runner, episode) -> None:  # (runner, env_index, episode)
            pass

    class NoEpisode(jr.multi_agent.AgentCallbacks):
        def on_agent_episode_end(self, runner) -> None:
            pass

    class Flexible(jr.multi_agent.AgentCallbacks):
        def on_episode_step(self, *args, **kwargs) -> None:
            pass

    for callbacks, hook in ((NoEnvIndex(), r"on_episode_end\(runner, env_index, episode\)"),
                            (NoEpisode(), r"on_agent_episode_end\(runner, episode\)")):  # fmt: skip
        with pytest.raises(TypeError, match=rf"{type(callbacks).__name__}\..* as {hook}"):
            make_runner("sync", callbacks)  # not at the first episode's end, mid-sample
    with make_runner("sync", Flexible()) as runner:
        runner.sample()


def test_a_callback_may_set_params_while_the_runner_samples():
    class SetsParams(jr.Callbacks):
        def on_episode_end(self, runner, env_index, episode) -> None:
            runner.set_params(runner.get_params())  # e.g. a schedule

    with make_runner("sync", SetsParams()) as runner:
        for _ in range(3):
            assert runner.sample().num_steps == 7


def constant_action_policy() -> jr.Policy:
    """Every agent slot takes action ``params["a"]``."""
    import jax.numpy as jnp

    def apply_fn(params, obs, carry, keys):
        return jnp.full((keys.shape[0],), params["a"], jnp.int32), {}, carry

    return jr.Policy(apply_fn)


@pytest.mark.parametrize("kind", ["gymnasium", "parallel", "aec"])
def test_params_set_by_a_callback_while_it_samples_apply_from_the_next_sample(kind):
    """What must hold: set_params called from a per-step hook leaves the running sample
    on the params it started with (the same on every kind of env and whatever the
    pipelining splits: a split's next action may already be computed) and applies from
    the next sample() on, as EnvRunner.set_params documents."""
    pytest.importorskip("pettingzoo")
    import jax.numpy as jnp

    from tests.multi_agent_envs import make_kind

    class SwitchesOnce(jr.multi_agent.AgentCallbacks):
        def __init__(self) -> None:
            self.switched = False

        def on_episode_step(self, runner, env_index, episode) -> None:
            if not self.switched and env_index == 0 and episode.length == 2:
                runner.set_params({"a": jnp.array(1, jnp.int32)}, runner.policy_ids[0])
                self.switched = True

    actions = {}
    for num_splits in (1, 2):
        envs = make_kind(kind, 2)
        zero = {"a": jnp.array(0, jnp.int32)}
        runner = jr.EnvRunner(
            envs, constant_action_policy(), zero, 6, seed=0, callbacks=SwitchesOnce(),
            num_splits=num_splits,
        )  # fmt: skip
        with runner:
            samples = [jax.device_get(runner.sample()) for _ in range(2)]
        acted = []
        for traj in samples:
            if kind == "gymnasium":
                acted.append(np.asarray(traj.action)[traj.valid])
                continue
            group = traj.groups[runner.policy_ids[0]]
            valid = np.asarray(group.valid).copy()
            if kind == "aec" and traj is samples[1]:  # its first transition: an earlier turn's
                valid &= np.cumsum(valid, axis=0) > 1
            acted.append(np.asarray(group.action)[valid])
        assert (acted[0] == 0).all(), (kind, num_splits, acted[0])
        assert acted[1].size and (acted[1] == 1).all(), (kind, num_splits, acted[1])
        actions[num_splits] = acted
    for got, want in zip(actions[2], actions[1]):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("call", ["sample", "save", "restore", "stop"])
def test_the_runner_refuses_calls_from_its_own_hooks_while_it_samples(call, tmp_path):
    class Reenters(jr.Callbacks):
        def on_episode_step(self, runner, env_index, episode) -> None:
            args = (tmp_path / "c.ckpt",) if call in ("save", "restore") else ()
            getattr(runner, call)(*args)

    refused = rf"{call}\(\) called while sample\(\) runs"
    with (
        make_runner("sync", Reenters()) as runner,
        pytest.raises(InvalidArgumentError, match=refused),
    ):
        runner.sample()


def test_a_restore_that_resets_the_envs_starts_each_env_episode_once(tmp_path):
    class Starts(jr.Callbacks):
        def __init__(self) -> None:
            self.started: list[tuple[int, int]] = []

        def on_episode_start(self, runner, env_index, episode) -> None:
            self.started.append((env_index, episode.episode_id))

    with make_runner("sync", Starts()) as runner:
        runner.sample()
        runner.save(tmp_path / "c.ckpt")
    hooks = Starts()
    with make_runner("sync", hooks) as runner:
        hooks.started.clear()
        with pytest.warns(UserWarning, match="every env was reset"):
            runner.restore(tmp_path / "c.ckpt")  # no env pickles loaded: new episodes
        restarted = list(hooks.started)
        first = runner.sample().episode_id[0]
    assert restarted == [(b, int(first[b])) for b in range(3)]


def test_a_failed_sample_episodes_keeps_the_episodes_it_completed():
    fns = faulty_env_fns(short_cartpole, 3, faults={0: [FaultPlan(at=(40,))]})
    envs = jr.make_vec(fns, 3)  # no restart policy: the fault raises
    policy = mlp_policy(envs.single_action_space, hidden=(8,))
    params = policy.init(jax.random.key(1), envs.single_observation_space)
    runner = jr.EnvRunner(envs, policy, params, 7, seed=2)
    with runner, pytest.raises(jr.errors.EnvError, match="injected failure") as info:
        runner.sample_episodes(100)
    kept = info.value.partial_episodes
    assert len(kept) >= 3 and all(e.is_complete and e.is_done for e in kept)
    assert info.value.partial_trajectory is not None
