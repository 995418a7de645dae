"""MultiAgentTrajectory.save/load: exact round trips of real samples (PettingZoo parallel
and turn-based envs), and every damaged or hostile file refused with an error naming the
field, through the same bounded reader as Trajectory.load."""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import pytest

pytest.importorskip("pettingzoo")

import jaxrunner as jr
from jaxrunner.errors import InvalidArgumentError
from tests import multi_agent_envs as envs_mod
from tests.test_multi_agent import random_policy, zero_params


def sample(factory: Callable[[], Any], num_actions: int, *, masked: bool = False, length: int = 12):
    """One sample of ``length`` steps of two ``factory`` envs under a random policy."""
    envs = jr.make_multi_agent_vec(factory, 2)
    policy = random_policy(num_actions, masked)
    params = {pid: zero_params(num_actions) for pid in envs.policy_ids}
    with jr.EnvRunner(envs, policy, params, length, seed=3) as runner:
        return runner.sample()


def assert_same(got: jr.MultiAgentTrajectory, want: jr.MultiAgentTrajectory) -> None:
    """Same structure (groups, fields, agent ids), and every array equal in shape,
    dtype and values."""
    assert isinstance(got, jr.MultiAgentTrajectory)
    assert got.agents == want.agents
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert isinstance(a, np.ndarray)
        assert (a.shape, a.dtype) == (b.shape, b.dtype)
        np.testing.assert_array_equal(a, b)


ENVS = {
    # agents that appear and leave mid-episode (parallel API)
    "coming_and_going": (envs_mod.coming_and_going, 3, False, None),
    # turn-based (AEC), Dict observations with action masks
    "tictactoe": (envs_mod.tictactoe, 9, True, None),
    # MPE: two groups with different observation spaces (parallel API)
    "simple_adversary": (envs_mod.simple_adversary, 5, False, "mpe2"),
    "simple_spread": (envs_mod.simple_spread, 5, False, "mpe2"),
}


@pytest.mark.parametrize("name", list(ENVS))
def test_save_load_round_trip_of_a_real_sample(tmp_path: Any, name: str) -> None:
    factory, num_actions, masked, needs = ENVS[name]
    if needs:
        pytest.importorskip(needs)
    traj = sample(factory, num_actions, masked=masked)
    assert traj.num_steps == 12 and traj.num_envs == 2
    for group in traj.groups.values():  # the sample has transitions and empty slots alike
        assert group.valid.any()
    traj.save(tmp_path / "traj.npz")
    loaded = jr.MultiAgentTrajectory.load(tmp_path / "traj.npz")
    assert_same(loaded, traj)
    # What a user reads from it is the same too.
    assert [e.agent_id for e in loaded.split_episodes()] == [
        e.agent_id for e in traj.split_episodes()
    ]
    # Plain arrays only: the file loads without pickle.
    with np.load(tmp_path / "traj.npz", allow_pickle=False) as data:
        for member in data.files:
            assert data[member].dtype != object


def test_save_load_path_without_npz_suffix_and_zero_steps(tmp_path: Any) -> None:
    traj = sample(envs_mod.coming_and_going, 3, length=4)
    traj.save(tmp_path / "traj")
    assert_same(jr.MultiAgentTrajectory.load(tmp_path / "traj"), traj)
    empty = jax.tree.map(lambda x: x[:0], traj)
    empty.save(tmp_path / "empty.npz")
    loaded = jr.MultiAgentTrajectory.load(tmp_path / "empty.npz")
    assert loaded.num_steps == 0
    assert_same(loaded, empty)


# -- load trusts nothing in the file -------------------------------------------------------


@pytest.mark.parametrize("name", ["coming_and_going", "tictactoe"])
def test_time_slice_and_concatenate_as_for_a_trajectory(name: str) -> None:
    """The mechanisms jr.Trajectory has (time_slice, jr.concatenate, to_numpy, the
    [T, B] counts) hold for multi-agent trajectories and their groups."""
    factory, num_actions, masked, _ = ENVS[name]
    traj = sample(factory, num_actions, masked=masked)
    pieces = [traj.time_slice(0, 5), traj.time_slice(5, 5), traj.time_slice(5, 12)]
    assert [(p.num_steps, p.num_envs) for p in pieces] == [(5, 2), (0, 2), (7, 2)]
    assert_same(jr.concatenate(pieces), traj)
    assert_same(jr.concatenate([traj]).to_numpy(), traj)
    group = traj.groups["policy_0"]
    assert (group.num_steps, group.num_envs) == (12, 2)
    np.testing.assert_array_equal(group.time_slice(5, 12).done, pieces[2].groups["policy_0"].done)
    other_factory, other_actions, other_masked, _ = ENVS[
        "tictactoe" if name != "tictactoe" else "coming_and_going"
    ]
    other = sample(other_factory, other_actions, masked=other_masked)
    with pytest.raises(ValueError, match=r"different structure.*Only in trajectory 1"):
        jr.concatenate([traj, other])
    with pytest.raises(ValueError, match="1 envs, trajectory 0 has 2"):
        jr.concatenate([traj, jax.tree.map(lambda x: x[:, :1], traj)])
    with pytest.raises(ValueError, match="different structure"):
        jr.concatenate([traj, traj.groups["policy_0"]])
    # A sample whose env failed a step has an env-level valid, one without has none.
    failed = np.ones((5, 2), np.bool_)
    failed[3, 1] = False
    joined = jr.concatenate([pieces[0].replace(valid=failed), pieces[2].replace(valid=None)])
    np.testing.assert_array_equal(joined.valid, np.concatenate([failed, np.ones((7, 2), bool)]))
    assert_same(joined.replace(valid=traj.valid), traj)


@pytest.fixture(scope="module")
def saved() -> jr.MultiAgentTrajectory:
    """A tictactoe sample (Dict observations, one group of two agents)."""
    return sample(envs_mod.tictactoe, 9, masked=True, length=6)


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, array, allow_pickle=True)
    return buffer.getvalue()


def _members(path: Any) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as zf:
        return {name: zf.read(name) for name in zf.namelist()}


def _spec(path: Any) -> dict[str, Any]:
    return json.loads(str(np.load(io.BytesIO(_members(path)["__spec__.npy"]))))


def _write(path: Any, members: list[tuple[str, bytes]]) -> None:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members:
            zf.writestr(name, data)


def _rewrite(path: Any, edit_spec: Any = None, members: dict[str, bytes] | None = None) -> None:
    """Rewrites the file at ``path``: ``edit_spec(spec)`` edits its spec in place,
    ``members`` replace or add raw zip members."""
    raw = _members(path)
    if edit_spec is not None:
        spec = _spec(path)
        edit_spec(spec)
        raw["__spec__.npy"] = _npy(np.array(json.dumps(spec)))
    raw.update(members or {})
    _write(path, list(raw.items()))


def _group(spec: dict[str, Any]) -> dict[str, Any]:
    return spec["groups"]["policy_0"]["fields"]


def _member(spec: dict[str, Any], *where: str) -> str:
    """The member name behind field ``where`` (``"env_id"``, ``"policy_0", "reward"``)."""
    fields = _group(spec) if where[0] == "policy_0" else spec["fields"]
    node = fields[where[-1]]
    return node["array"] + ".npy"


def _deep(depth: int) -> dict[str, Any]:
    node: dict[str, Any] = {"none": True}
    for _ in range(depth):
        node = {"dict": {"a": node}}
    return node


# What is wrong with the spec -> what the error says (each names the field at fault).
BAD_SPECS: dict[str, Callable[[dict[str, Any]], Any]] = {
    r"missing \['env_done'\], unknown \[\]": lambda s: s["fields"].pop("env_done"),
    r"unknown \['spare'\]": lambda s: s["fields"].update(spare={"none": True}),
    r"in groups.policy_0; missing \['valid'\]": lambda s: _group(s).pop("valid"),
    r"in groups.policy_0; missing \[\], unknown \['x'\]": lambda s: _group(s).update(
        x={"none": True}
    ),
    r"no 'groups' object": lambda s: s.pop("groups"),
    r"no 'groups.policy_0.fields' object": lambda s: s["groups"]["policy_0"].pop("fields"),
    r"groups.policy_0.agents 'player_1'": lambda s: s["groups"]["policy_0"].update(
        agents="player_1"
    ),
    r"groups.policy_0.agents \[\]": lambda s: s["groups"]["policy_0"].update(agents=[]),
    r"groups.policy_0.agents \[1, 2\]": lambda s: s["groups"]["policy_0"].update(agents=[1, 2]),
    r"groups.policy_0.agents naming \['player_1'\] more than once": lambda s: s["groups"][
        "policy_0"
    ].update(agents=["player_1", "player_1"]),
    r"groups.policy_1.agents naming \['player_2'\] more than once": lambda s: s["groups"].update(
        policy_1={"agents": ["player_2"], "fields": _group(s)}
    ),
    # the group's arrays hold two agents; the spec names one
    r"groups.policy_0.obs.action_mask of shape \[6, 2, 2, 9\]; every field must start "
    r"with \[6, 2, 1\] \(env_id's \[T, B\] and the group's 1 agents\)": lambda s: s["groups"][
        "policy_0"
    ].update(agents=["player_1"]),
    r"field groups.policy_0.obs.x with": lambda s: _group(s)["obs"]["dict"].update(
        x={"array": "nope"}
    ),
    r"field groups.policy_0.action with '\[1, 2\]'": lambda s: _group(s).update(action=[1, 2]),
    r"nests field groups.policy_0.extras.*deeper than 32": lambda s: _group(s).update(
        extras=_deep(40)
    ),
    # an env-level [T, B] array where a group's [T, B, A] one belongs
    r"field groups.policy_0.terminated that is not one \[6, 2, 2\]-shaped array": lambda s: (
        _group(s).update(terminated=s["fields"]["env_done"]),
        s["fields"].update(env_done={"array": "spare"}),
    ),
    r"field groups.policy_0.extras that is not an object of named arrays": lambda s: _group(
        s
    ).update(extras={"array": "spare"}),
    r"groups.policy_0.next_obs shaped unlike groups.policy_0.obs": lambda s: _group(s).update(
        next_obs={"dict": {"observation": _group(s)["next_obs"]["dict"]["observation"]}}
    ),
    # one member named for two fields: 60 fields would make it 60 allocations
    r"again for field groups.policy_0.extras.k0": lambda s: _group(s).update(
        extras={"dict": {f"k{i}": s["fields"]["step"] for i in range(60)}}
    ),
}


@pytest.mark.parametrize("match", list(BAD_SPECS))
def test_load_names_what_is_wrong_with_a_bad_spec(tmp_path: Any, saved: Any, match: str) -> None:
    path = tmp_path / "traj.npz"
    saved.save(path)
    # spare: an unreferenced member some edits point a field to
    _rewrite(path, BAD_SPECS[match], members={"spare.npy": _npy(np.zeros((6, 2), bool))})
    with pytest.raises(InvalidArgumentError, match=match):
        jr.MultiAgentTrajectory.load(path)


# A field's member replaced -> what the error says.
BAD_MEMBERS: dict[str, tuple[tuple[str, ...], bytes]] = {
    r"has a env_id of shape \(6,\); expected \[T, B\]": (("env_id",), _npy(np.zeros(6, int))),
    r"has field episode_id of shape \[6, 3\]; every field must start with \[6, 2\]": (
        ("episode_id",),
        _npy(np.zeros((6, 3), np.int64)),
    ),
    r"field groups.policy_0.reward of shape \[6, 2, 3\]": (
        ("policy_0", "reward"),
        _npy(np.zeros((6, 2, 3))),
    ),
    r"field groups.policy_0.obs.observation of shape \[6, 2\]": (
        ("policy_0", "observation"),
        _npy(np.zeros((6, 2), np.int8)),
    ),
    r"field groups.policy_0.valid of dtype uint8; expected kind 'b'": (
        ("policy_0", "valid"),
        _npy(np.ones((6, 2, 2), np.uint8)),
    ),
    r"field env_done of dtype float32; expected kind 'b'": (
        ("env_done",),
        _npy(np.zeros((6, 2), np.float32)),
    ),
    r"field groups.policy_0.reward of dtype int64; expected kind 'f'": (
        ("policy_0", "reward"),
        _npy(np.zeros((6, 2, 2), np.int64)),
    ),
    r"field groups.policy_0.agent_step of dtype float64; expected kind 'iu'": (
        ("policy_0", "agent_step"),
        _npy(np.zeros((6, 2, 2))),
    ),
    # a pickled object array: never unpickled
    r"stores field groups.policy_0.reward as object": (
        ("policy_0", "reward"),
        _npy(np.array([[[{"x": 1}] * 2] * 2] * 6, dtype=object)),
    ),
    # a header promising more than the member holds
    r"member for field step whose size": (
        ("step",),
        _npy(np.zeros((6, 2), np.int64)).replace(b"(6, 2)", b"(60, 2)"),
    ),
    r"unreadable member for field groups.policy_0.action": (
        ("policy_0", "action"),
        b"not an npy member",
    ),
}


@pytest.mark.parametrize("match", list(BAD_MEMBERS))
def test_load_names_what_is_wrong_with_a_bad_member(tmp_path: Any, saved: Any, match: str) -> None:
    path = tmp_path / "traj.npz"
    saved.save(path)
    where, data = BAD_MEMBERS[match]
    spec = _spec(path)
    if where[-1] == "observation":
        member = _group(spec)["obs"]["dict"]["observation"]["array"] + ".npy"
    else:
        member = _member(spec, *where)
    _rewrite(path, members={member: data})
    with pytest.raises(InvalidArgumentError, match=match):
        jr.MultiAgentTrajectory.load(path)


def test_load_refuses_a_damaged_file(tmp_path: Any, saved: Any) -> None:
    path = tmp_path / "traj.npz"
    saved.save(path)
    whole = path.read_bytes()
    # Cut short: the zip's directory (at its end) is gone.
    path.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(InvalidArgumentError, match=r"cannot be opened as a \.npz"):
        jr.MultiAgentTrajectory.load(path)
    # One byte of a member flipped in the file: its CRC no longer matches.
    saved.save(path)  # np.savez stores members uncompressed: their bytes are in the file
    reward = _members(path)[_member(_spec(path), "policy_0", "reward")]
    whole = bytearray(path.read_bytes())
    at = whole.index(reward) + len(reward) - 1
    whole[at] ^= 0xFF
    path.write_bytes(bytes(whole))
    with pytest.raises(InvalidArgumentError, match=r"unreadable member for field groups.*CRC"):
        jr.MultiAgentTrajectory.load(path)
    path.write_bytes(b"not a zip")
    with pytest.raises(InvalidArgumentError, match="cannot be opened"):
        jr.MultiAgentTrajectory.load(path)


def test_load_refuses_a_bad_spec_member(tmp_path: Any, saved: Any) -> None:
    path = tmp_path / "traj.npz"
    for member, match in [
        (_npy(np.array("[" * 100_000)), "spec that is not valid JSON"),
        (_npy(np.array("{" * 10)), "spec that is not valid JSON"),
        (_npy(np.array("[1, 2]")), "spec that is not a JSON object"),
        (_npy(np.array(["{}", "{}"])), r"spec of shape \(2,\); expected one string"),
        (_npy(np.array(" " * (1 << 18))), "-byte spec; the limit is 1048576"),
    ]:
        saved.save(path)
        _rewrite(path, members={"__spec__.npy": member})
        with pytest.raises(InvalidArgumentError, match=match):
            jr.MultiAgentTrajectory.load(path)


def test_load_refuses_a_member_stored_twice(tmp_path: Any, saved: Any) -> None:
    """Two zip entries of one name: which a reader takes would be a guess."""
    path = tmp_path / "traj.npz"
    saved.save(path)
    member = _member(_spec(path), "policy_0", "reward")
    raw = list(_members(path).items())
    fake = _npy(np.full((6, 2, 2), 1e9))
    with pytest.warns(UserWarning, match="Duplicate name"):
        _write(path, [*raw, (member, fake)])
    with pytest.raises(InvalidArgumentError, match=f"two members named '{member}'"):
        jr.MultiAgentTrajectory.load(path)


def test_load_reads_only_the_members_the_spec_names(tmp_path: Any, saved: Any) -> None:
    """A 64 MiB member deflated to a few KiB, and one whose header promises 8 TiB, that
    no field names: never read, so a 1 MiB budget suffices."""
    path = tmp_path / "traj.npz"
    saved.save(path)
    huge = _npy(np.zeros(2, np.float64)).replace(b"(2,)", b"(1099511627776,)")
    bomb = _npy(np.zeros(1 << 23, np.float64))
    _rewrite(path, members={"bomb.npy": bomb, "junk.npy": huge, "noise.npy": b"\x00" * 100})
    assert path.stat().st_size < 1 << 20
    assert_same(jr.MultiAgentTrajectory.load(path, max_bytes=1 << 20), saved)
    # Named by a field, the same bomb is refused before it is inflated.
    _rewrite(path, lambda s: _group(s)["extras"]["dict"].update(bomb={"array": "bomb"}))
    with pytest.raises(InvalidArgumentError, match=r"field groups.policy_0.extras.bomb alone"):
        jr.MultiAgentTrajectory.load(path, max_bytes=1 << 20)


def test_load_keeps_trajectory_load_limits(tmp_path: Any, saved: Any) -> None:
    path = tmp_path / "traj.npz"
    saved.save(path)
    with pytest.raises(InvalidArgumentError, match="pass a larger max_bytes"):
        jr.MultiAgentTrajectory.load(path, max_bytes=100)
    assert_same(jr.MultiAgentTrajectory.load(path, max_bytes=None), saved)


def test_load_refuses_other_files(tmp_path: Any, saved: Any) -> None:
    path = tmp_path / "other.npz"
    np.savez(path, x=np.arange(3))
    with pytest.raises(InvalidArgumentError, match="not a jaxrunner trajectory"):
        jr.MultiAgentTrajectory.load(path)
    # A single-agent trajectory file is not a multi-agent one, nor the other way round.
    single = jr.Trajectory(
        obs=np.zeros((2, 1)),
        action=np.zeros((2, 1)),
        reward=np.zeros((2, 1)),
        terminated=np.zeros((2, 1), bool),
        truncated=np.zeros((2, 1), bool),
        next_obs=np.zeros((2, 1)),
        extras={},
        env_id=np.zeros((2, 1), int),
        episode_id=np.zeros((2, 1), int),
        step=np.zeros((2, 1), int),
    )
    single.save(path)
    with pytest.raises(InvalidArgumentError, match=r"expected format jaxrunner\.MultiAgent"):
        jr.MultiAgentTrajectory.load(path)
    saved.save(path)
    with pytest.raises(InvalidArgumentError, match=r"expected format jaxrunner\.Trajectory "):
        jr.Trajectory.load(path)
    _rewrite(path, lambda s: s.update(version=2))
    with pytest.raises(InvalidArgumentError, match=r"version 1, got .* version 2"):
        jr.MultiAgentTrajectory.load(path)
