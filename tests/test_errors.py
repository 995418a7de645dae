"""Every jaxrunner exception survives a pickle round trip (Ray and workers send them)."""

from __future__ import annotations

import inspect
import pickle

import pytest

import jaxrunner.errors as errors

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
    import jaxrunner as jr

    kwargs = {"apply_fn": lambda params, obs, carry, keys: None, name: object()}
    if name == "apply_fn":
        kwargs["apply_fn"] = None
    with pytest.raises(errors.InvalidArgumentTypeError, match=rf"Policy\({name}=\.\.\.\)"):
        jr.Policy(**kwargs)
