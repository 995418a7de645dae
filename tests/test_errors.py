"""Every jaxrunner exception survives a pickle round trip (Ray and workers send them)."""

from __future__ import annotations

import importlib.util
import inspect
import pickle

import gymnasium
import jax
import numpy as np
import pytest

import jaxrunner as jr
import jaxrunner.errors as errors
from jaxrunner.models import mlp_policy

ERROR_CLASSES = sorted(
    (
        obj
        for obj in vars(errors).values()
        if isinstance(obj, type)
        and issubclass(obj, BaseException)
        and obj.__module__ == errors.__name__
    ),
    key=lambda cls: cls.__name__,
)

# A value for each constructor argument a jaxrunner error takes; a new argument must
# be added here, so no class escapes the round trip.
SAMPLE_ARGUMENTS = {
    "message": "what went wrong, where, and how to fix it",
    "env_index": 3,
    "worker_index": 2,
    "env_indices": range(4, 6),
    "ended": True,
}


def _make(cls: type[BaseException]) -> BaseException:
    kwargs = {}
    for name, param in list(inspect.signature(cls.__init__).parameters.items())[1:]:
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if name not in SAMPLE_ARGUMENTS:
            raise AssertionError(f"{cls.__name__}({name}=...): add a sample value for it")
        kwargs[name] = SAMPLE_ARGUMENTS[name]
    if not kwargs:
        return cls(SAMPLE_ARGUMENTS["message"])
    return cls(**kwargs)


def test_the_module_has_the_known_classes():
    names = {cls.__name__ for cls in ERROR_CLASSES}
    assert {"JaxRunnerError", "EnvError", "WorkerError", "WorkerTimeoutError"} <= names


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda cls: cls.__name__)
def test_every_error_survives_pickling_with_its_attributes(cls):
    error = _make(cls)
    error.partial_trajectory = {"steps": 7}
    try:
        raise error from KeyError("the original")
    except BaseException as raised:
        error = raised
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is cls
    assert str(back) == str(error)
    assert back.args == error.args
    assert vars(back) == vars(error)
    assert back.partial_trajectory == {"steps": 7}
    assert isinstance(back.__cause__, KeyError) and back.__cause__.args == ("the original",)
    assert isinstance(back, errors.JaxRunnerError)


def test_an_unpicklable_cause_is_kept_as_text():
    error = errors.EnvError("env 2 raised", env_index=2)
    error.__cause__ = _Unpicklable("the socket broke")
    back = pickle.loads(pickle.dumps(error))
    assert back.env_index == 2
    assert isinstance(back.__cause__, RuntimeError)
    assert "_Unpicklable: the socket broke" in str(back.__cause__)


class _Unpicklable(Exception):
    def __reduce__(self):
        raise TypeError("cannot pickle this")


@pytest.mark.parametrize("name", ["apply_fn", "init_fn", "log_prob_fn", "evaluate_fn"])
def test_policy_with_a_non_function_names_the_argument(name):
    kwargs = {"apply_fn": lambda params, obs, carry, keys: None, name: object()}
    if name == "apply_fn":
        kwargs["apply_fn"] = None
    with pytest.raises(errors.InvalidArgumentTypeError, match=rf"Policy\({name}=\.\.\.\)"):
        jr.Policy(**kwargs)


# -- new users' mistakes: named where they are made ------------------------------------------


def _not_an_env() -> dict:
    return {"obs": 0}


class _OldApiReset(gymnasium.Env):
    """The old gym API's reset: the observation alone."""

    observation_space = gymnasium.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gymnasium.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        return np.zeros(2, np.float32)

    def step(self, action):
        return np.zeros(2, np.float32), 0.0, False, False, {}


class _OldApiStep(_OldApiReset):
    """The old gym API's step: (obs, reward, done, info)."""

    def reset(self, *, seed=None, options=None):
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), 0.0, False, {}


@pytest.mark.parametrize("backend", ["sync", "process"])
def test_a_factory_that_returns_no_env_is_named(backend):
    with pytest.raises(
        errors.InvalidArgumentTypeError, match="factory of sub-env 0 returned a dict with keys"
    ) as info:
        jr.make_vec(_not_an_env, 2, backend=backend)
    assert isinstance(info.value, TypeError)


@pytest.mark.parametrize("backend", ["sync", "process"])
@pytest.mark.parametrize(("env_class", "call"), [(_OldApiReset, "reset"), (_OldApiStep, "step")])
def test_an_old_gym_api_env_is_named_as_such(backend, env_class, call):
    envs = jr.make_vec(env_class, 2, backend=backend)
    policy = mlp_policy(envs.single_action_space, hidden=(4,))
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    with pytest.raises(errors.InvalidStepError, match=rf"{call}\(\) returned .* old gym API"):
        jr.EnvRunner(envs, policy, params, 4, 0).sample()
    envs.close()


def test_an_old_gym_api_step_is_no_fault_to_restart():
    envs = jr.make_vec(_OldApiStep, 2, restart_policy=jr.RestartPolicy())
    policy = mlp_policy(envs.single_action_space, hidden=(4,))
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    with jr.EnvRunner(envs, policy, params, 4, 0) as runner:
        with pytest.raises(errors.InvalidStepError, match="old gym API"):
            runner.sample()
        assert envs.num_restarts == 0


class _StepReturns(_OldApiStep):
    """A step that returns ``self.result`` (its observation first where it is a sequence)."""

    result: object = None

    def step(self, action):
        return self.result


@pytest.mark.parametrize(
    ("result", "refused"),
    [
        (None, "returned a NoneType"),
        ({"obs": 0, "r": 0, "te": 0, "tr": 0, "info": 0}, "returned a dict"),
        ("abcde", "returned a str"),
        ([np.zeros(2, np.float32), 1.0, False, False, {}], None),  # a list of five: accepted
    ],
)
def test_a_step_that_returns_no_tuple_of_five_is_the_wrong_api_not_a_fault(result, refused):
    env_class = type("Returns", (_StepReturns,), {"result": result})
    envs = jr.make_vec(env_class, 2, restart_policy=jr.RestartPolicy())
    envs.reset_batch([0, 1])
    actions = np.zeros(2, np.int64)
    if refused is None:
        np.testing.assert_array_equal(envs.step_batch(actions).reward, [1.0, 1.0])
    else:
        with pytest.raises(errors.InvalidStepError, match=rf"sub-env 0's step\(\) {refused}"):
            envs.step_batch(actions)
        assert envs.num_restarts == 0
    envs.close()


@pytest.mark.parametrize("backend", ["sync", "gymnasium"])
def test_an_unregistered_ale_id_says_how_to_register_it(backend, monkeypatch):
    from jaxrunner._src.backends import env_api

    # ale_py is not installed in the test environment: the fix is to install it.
    if importlib.util.find_spec("ale_py") is None:
        with pytest.raises(gymnasium.error.NamespaceNotFound, match="pip install ale-py"):
            jr.make_vec("ALE/Pong-v5", 2, backend)
    # A registering package that is installed but not imported: the fix is to import it
    # (json stands in for ale_py: importable, and registers nothing).
    monkeypatch.setitem(env_api._REGISTERING_PACKAGES, "Fake", ("json", "json"))
    with pytest.raises(gymnasium.error.NamespaceNotFound) as info:
        jr.make_vec("Fake/Game-v0", 2, backend)
    assert "json is installed but not imported" in str(info.value)
    assert "gymnasium.register_envs(json)" in str(info.value)
    # Other namespaces keep gymnasium's own message.
    with pytest.raises(gymnasium.error.NamespaceNotFound) as info:
        jr.make_vec("Nowhere/Game-v0", 2, backend)
    assert "make_vec" not in str(info.value)
