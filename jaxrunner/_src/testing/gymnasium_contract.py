"""The contract's checks of gymnasium's vector API (``reset``, ``step``, spaces and
metadata), which only a backend serving gymnasium envs runs: a mixin of
:class:`~jaxrunner._src.testing.contract.VectorEnvContract`."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import closing
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode

from jaxrunner._src.testing.assertions import assert_trees_equal
from jaxrunner._src.testing.envs import CountingEnv, counting_env_fns
from jaxrunner._src.testing.reference import ContractParts, gymnasium_reference


def _gymnasium_only(test: Callable) -> Callable:
    """Runs a contract test on gymnasium envs only (where the backend serves them)."""
    test.contract_kinds = ("gymnasium",)  # type: ignore[attr-defined]
    return test


class GymnasiumVectorApiContract(ContractParts):
    """The checks on gymnasium envs listed last in
    :class:`~jaxrunner._src.testing.contract.VectorEnvContract`'s docstring."""

    def _gymnasium_parity(
        self, vec: Any, ref: Any, name: str, num_steps: int, *, require_end: bool = True
    ) -> None:
        """Steps both with the same sampled actions and asserts equal results."""
        ref.action_space.seed(self.seed)
        ends = 0
        for t in range(num_steps):
            actions = ref.action_space.sample()
            expected = ref.step(actions)
            assert_trees_equal(vec.step(actions), expected, f"{name}: step {t}")
            ends += int(np.sum(expected[2] | expected[3]))
        if require_end and ends == 0:  # a parity run without an episode end would prove little
            raise AssertionError(f"{name}: no episode ended in {num_steps} steps")

    @_gymnasium_only
    def test_metadata_and_spaces(self, kind: str) -> None:
        fns = counting_env_fns(self.num_envs)
        with closing(self._make(kind, fns)) as vec, closing(gymnasium_reference(fns)) as ref:
            if vec.metadata.get("autoreset_mode") != AutoresetMode.SAME_STEP:
                raise AssertionError(f"metadata autoreset_mode: {vec.metadata!r}")
            for name in (
                "num_envs",
                "single_observation_space",
                "single_action_space",
                "observation_space",
                "action_space",
            ):
                if getattr(vec, name) != getattr(ref, name):
                    raise AssertionError(f"{name}: {getattr(vec, name)} != {getattr(ref, name)}")

    @_gymnasium_only
    def test_step_for_step_equal_to_gymnasium(self, kind: str) -> None:
        self.kind = kind
        for name, case in self.env_cases().items():
            fns = self._fns(case)
            with closing(self._make(kind, fns)) as vec, closing(gymnasium_reference(fns)) as ref:
                assert_trees_equal(vec.reset(seed=self.seed), ref.reset(seed=self.seed), name)
                self._gymnasium_parity(vec, ref, name, self.num_steps)
                # A second, explicitly seeded reset mid-run restarts every sub-env alike.
                seeds: list[int | None] = [self.seed + 10 * i for i in range(self.num_envs)]
                assert_trees_equal(vec.reset(seed=seeds), ref.reset(seed=seeds), name)
                self._gymnasium_parity(vec, ref, f"{name} after reset", self.num_steps)

    @_gymnasium_only
    def test_reset_seeds_sub_env_i_with_seed_plus_i(self, kind: str) -> None:
        n = self.num_envs
        with closing(self._make(kind, counting_env_fns(n))) as vec:
            obs, _ = vec.reset(seed=7)
            np.testing.assert_array_equal(obs[:, CountingEnv.SEED], 7 + np.arange(n))
            np.testing.assert_array_equal(obs[:, CountingEnv.ENV_ID], np.arange(n))
            seeds = [100 + 3 * i for i in range(n)]
            obs, _ = vec.reset(seed=seeds)  # a list is taken as is
            np.testing.assert_array_equal(obs[:, CountingEnv.SEED], seeds)

    @_gymnasium_only
    def test_reset_mask_resets_those_envs_only(self, kind: str) -> None:
        """``reset(options={"reset_mask": m})`` resets the masked sub-envs only, as
        gymnasium's ``SyncVectorEnv`` does."""
        fns = counting_env_fns(self.num_envs, episode_length=3, max_episode_steps=4)
        with closing(self._make(kind, fns)) as vec, closing(gymnasium_reference(fns)) as ref:
            assert_trees_equal(vec.reset(seed=self.seed), ref.reset(seed=self.seed), "reset")
            self._gymnasium_parity(vec, ref, "before", 2, require_end=False)
            options = {"reset_mask": np.arange(self.num_envs) % 2 == 1}
            got = vec.reset(seed=self.seed + 5, options=dict(options))
            assert_trees_equal(got, ref.reset(seed=self.seed + 5, options=dict(options)), "mask")
            self._gymnasium_parity(vec, ref, "after the masked reset", 6)
