"""Model files never execute code: crafted zips (pickles, oversized entries, foreign formats) are one-line
errors, and a fuzz over mutated model files never raises anything else."""

from __future__ import annotations

import base64
import io
import json
import pathlib
import pickle
import tracemalloc
import zipfile

import gymnasium as gym
import numpy as np
import pytest
import torch

import bugfix_gym  # noqa: F401
from agents.bugfix import aux_losses  # noqa: F401 (registers how TokenPPO files of 4e10e0a are read)
from agents.files import checkpoint
from agents.algorithms.ppo import TokenPPO
from agents.algorithms.reinforce import Reinforce


@pytest.fixture(scope="module")
def good(tmp_path_factory, shared_base_agent) -> bytes:
    model = TokenPPO("TinyAgentPolicy", gym.make("BugFix-v0"), base_agent=shared_base_agent, n_episodes=4, seed=0)
    buf = io.BytesIO()
    model.save(buf)
    return buf.getvalue()


@pytest.fixture(scope="module", params=["TokenPPO", "Reinforce"])
def saved(request, shared_base_agent) -> tuple[type, bytes]:
    """A saved model of each algorithm; TokenPPO's with the KL penalty, so its file has ``ref_model.pth``."""
    cls, kwargs = {"TokenPPO": (TokenPPO, dict(kl_coef=0.05)), "Reinforce": (Reinforce, {})}[request.param]
    model = cls("TinyAgentPolicy", gym.make("BugFix-v0"), base_agent=shared_base_agent, n_episodes=4, seed=0,
                **kwargs)
    buf = io.BytesIO()
    model.save(buf)
    return cls, buf.getvalue()


def _entries(blob: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(blob)) as z:
        return {name: z.read(name) for name in z.namelist()}


def _zip(entries: dict[str, bytes], path) -> None:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for name, data in entries.items():
            z.writestr(name, data)


def _one_line_error(path, cls=TokenPPO) -> str:
    with pytest.raises(ValueError) as e:
        cls.load(path)
    assert "\n" not in str(e.value) and "Traceback" not in str(e.value)
    return str(e.value)


def test_the_saved_files_hold_the_entries_the_tests_below_poison(saved):
    cls, blob = saved
    expected = {"data", "policy.pth", "policy.optimizer.pth", "pytorch_variables.pth"}
    assert expected | ({"ref_model.pth"} if cls is TokenPPO else set()) <= set(_entries(blob))


def test_a_serialized_entry_in_data_is_refused_and_never_run(saved, tmp_path, pickle_bomb):
    cls, blob = saved
    bomb, marker = pickle_bomb
    entries = _entries(blob)
    data = json.loads(entries["data"])
    payload = base64.b64encode(pickle.dumps(bomb)).decode()
    data["policy_class"] = {":type:": "<class 'type'>", ":serialized:": payload}  # SB3's own encoding
    entries["data"] = json.dumps(data).encode()
    _zip(entries, tmp_path / "evil.zip")
    assert "refusing to unpickle" in _one_line_error(tmp_path / "evil.zip", cls)
    assert not marker.exists()


@pytest.mark.parametrize("entry", ["policy.pth", "policy.optimizer.pth", "pytorch_variables.pth", "ref_model.pth"])
def test_a_pickled_object_in_a_tensor_entry_is_refused_and_never_run(saved, tmp_path, pickle_bomb, entry):
    cls, blob = saved
    bomb, marker = pickle_bomb
    entries = _entries(blob)
    buf = io.BytesIO()
    torch.save({"weight": bomb}, buf)  # torch.save pickles the object
    entries[entry] = buf.getvalue()  # for Reinforce, ref_model.pth is an entry its files never have
    _zip(entries, tmp_path / "evil.zip")
    assert "not a plain tensor file" in _one_line_error(tmp_path / "evil.zip", cls)
    assert not marker.exists()


def test_a_pickled_object_in_a_state_dict_file_is_refused_and_never_run(tmp_path, pickle_bomb):
    """The ``base_agent=<path>`` file of both algorithms is read the same way."""
    bomb, marker = pickle_bomb
    torch.save({"weight": bomb}, tmp_path / "evil.pt")
    with pytest.raises(ValueError) as e:
        checkpoint.load_state_dict_file(tmp_path / "evil.pt")
    assert "not a TinyAgent weights file" in str(e.value) and "\n" not in str(e.value) and not marker.exists()


@pytest.mark.heavy
def test_an_oversized_entry_is_refused_before_it_is_read(good, tmp_path):
    entries = _entries(good)
    entries["data"] = b" " * (300 * 2**20)  # 300 MB of spaces: a ~300 KB file once deflated
    _zip(entries, tmp_path / "big.zip")
    assert (tmp_path / "big.zip").stat().st_size < 2 * 2**20
    tracemalloc.start()
    try:
        message = _one_line_error(tmp_path / "big.zip")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "allowed" in message and peak < 32 * 2**20


def test_a_lying_size_header_cannot_make_the_reader_read_more(good, tmp_path):
    """An entry whose header claims a small size but inflates to far more is cut at its limit."""
    entries = _entries(good)
    path = tmp_path / "lying.zip"
    _zip(dict(entries, data=b"{" + b" " * (20 * 2**20) + b"}"), path)
    blob = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as z:
        info = z.getinfo("data")
    real = info.file_size.to_bytes(4, "little")
    fake = (1000).to_bytes(4, "little")
    blob = blob.replace(real, fake)  # local header and central directory both claim 1000 bytes
    path.write_bytes(bytes(blob))
    message = _one_line_error(path)
    assert "model file" in message or "allowed" in message


def test_a_corrupt_deflate_stream_is_a_one_line_error(good, tmp_path):
    """Bytes flipped inside a compressed entry make zlib fail mid-read: still a one-line error."""
    path = tmp_path / "m.zip"
    _zip(dict(_entries(good), data=b"{" + b" " * 4000 + b"}"), path)  # deflated: long runs compress well
    with zipfile.ZipFile(path) as z:
        info = z.getinfo("data")
    assert info.compress_type == zipfile.ZIP_DEFLATED
    blob = bytearray(path.read_bytes())
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)  # the compressed bytes
    blob[start: start + 4] = b"\xff\xff\xff\xff"  # an invalid deflate block header
    path.write_bytes(bytes(blob))
    assert "not a bugfix-gym model file" in _one_line_error(path)


@pytest.mark.parametrize("content, match", [
    (b"", "not a bugfix-gym model file"),
    (b"PK\x03\x04garbage", "not a bugfix-gym model file"),
    (np.random.default_rng(0).bytes(5000), "not a bugfix-gym model file"),
])
def test_foreign_bytes_are_one_line_errors(tmp_path, content, match):
    path = tmp_path / "m.zip"
    path.write_bytes(content)
    assert match in _one_line_error(path)


@pytest.mark.parametrize("mutate, match", [
    (lambda e: {k: v for k, v in e.items() if k != "policy.pth"}, "needs 'data' and 'policy.pth'"),
    (lambda e: dict(e, **{"evil.py": b"print(1)"}), "unexpected entry"),
    (lambda e: dict(e, data=b"not json"), "not JSON"),
    (lambda e: dict(e, data=b"[1, 2]"), "not a JSON object"),
    (lambda e: dict(e, data=b"[" * 100000 + b"]" * 100000), "not JSON"),
    (lambda e: dict(e, data=json.dumps(dict(json.loads(e["data"]), format="other/1")).encode()), "format"),
    (lambda e: dict(e, data=json.dumps({k: v for k, v in json.loads(e["data"]).items() if k != "args"}).encode()),
     "no 'args'"),
    (lambda e: dict(e, data=json.dumps(dict(json.loads(e["data"]), args={"nope": 1})).encode()), "unknown argument"),
    (lambda e: dict(e, **{"policy.pth": b"\x00" * 64}), "not a plain tensor file"),
])
def test_malformed_model_files_are_one_line_errors(good, tmp_path, mutate, match):
    path = tmp_path / "m.zip"
    _zip(mutate(_entries(good)), path)
    assert match in _one_line_error(path)


def test_an_algorithm_mismatch_names_the_right_class(good, tmp_path):
    path = tmp_path / "ppo.zip"
    path.write_bytes(good)
    assert "load it with TokenPPO.load" in _one_line_error(path, Reinforce)


def test_fuzzed_model_files_only_ever_fail_with_value_errors(good, tmp_path):
    rng = np.random.default_rng(0)
    loaded = 0
    for trial in range(40):
        blob = bytearray(good)
        how = trial % 3
        if how == 0:  # truncate
            blob = blob[: int(rng.integers(1, len(blob)))]
        elif how == 1:  # flip a few bytes
            for i in rng.integers(0, len(blob), size=8):
                blob[i] ^= 0xFF
        else:  # overwrite a block with random bytes
            at = int(rng.integers(0, len(blob) - 64))
            blob[at: at + 64] = rng.bytes(64)
        path = tmp_path / f"fuzz{trial}.zip"
        path.write_bytes(bytes(blob))
        try:
            TokenPPO.load(path)
            loaded += 1  # a flip inside an unused byte can leave a loadable file
        except ValueError as e:
            assert "\n" not in str(e)
    assert loaded < 40


def test_the_file_layout_is_sb3s_and_reads_back_with_sb3s_own_unzipper(good, tmp_path):
    from stable_baselines3.common.save_util import load_from_zip_file

    path = tmp_path / "m.zip"
    path.write_bytes(good)
    data, params, _ = load_from_zip_file(path, load_data=True)  # nothing in it needs unpickling
    assert data["format"] == checkpoint.FORMAT and "policy" in params and "policy.optimizer" in params


# ---------------------------------------------------------------------- files saved by earlier versions
FIXTURES = pathlib.Path(__file__).parent / "fixtures"


@pytest.mark.parametrize("cls", [TokenPPO, Reinforce])
def test_model_files_saved_by_main_4e10e0a_still_load_and_act_the_same(cls):
    """Files written before the algorithm and the file module were split: the same weights (the same
    greedy action), the same counters and the same algorithm state."""
    name = cls.__name__.lower()
    expected = json.loads((FIXTURES / "main_4e10e0a_expected.json").read_text())[name]
    model = cls.load(FIXTURES / f"{name}_main_4e10e0a.zip")
    obs, _ = gym.make("BugFix-v0").reset(seed=3)
    action, _ = model.predict(obs, deterministic=True)
    assert str(action) == expected["action"]
    counters = model.training_progress()["counters"]
    assert (counters["num_timesteps"], counters["n_updates"]) == (expected["num_timesteps"], expected["n_updates"])
    assert (model.iteration, counters["total_policy_tokens"]) == (expected["iteration"],
                                                                  expected["total_policy_tokens"])
    assert model.training_progress()["state"] == expected["state"]


@pytest.mark.parametrize("name", ["grpo", "reinforce"])
def test_model_files_saved_by_main_34a6ebf_load_into_the_config_object(name, tmp_path):
    """Files written while the settings were copied onto the algorithm (tests/fixtures/make_main_34a6ebf.py):
    every saved setting lands in ``model.config``, the policy's call limit is the config's, the model acts and
    counts as it did, and saving it again writes the same settings."""
    from agents.algorithms.presets import load_algorithm

    expected = json.loads((FIXTURES / "main_34a6ebf_expected.json").read_text())[name]
    model = load_algorithm(FIXTURES / f"{name}_main_34a6ebf.zip")
    assert {key: getattr(model.config, key) for key in expected["settings"] if key != "aux_losses"} == \
        {key: value for key, value in expected["settings"].items() if key != "aux_losses"}
    assert model.policy.max_call_tokens == model.config.max_call_tokens == 6
    obs, _ = gym.make("LookThenAnswer-v0").reset(seed=3)
    assert str(model.predict(obs, deterministic=True)[0]) == expected["action"]
    assert model.training_progress() == expected["progress"]
    added = dict(episode_baseline="episode")  # the settings added since, saved at their defaults
    if name == "grpo":
        added.update(kl_reward_coef=0.0, kl_reward_estimator="k1")
    assert model.saved_arguments() == dict(expected["settings"], **added)


def test_max_call_tokens_is_given_once_a_second_value_in_policy_kwargs_is_an_error():
    """The call limit is a setting; a different one in ``policy_kwargs`` no longer wins silently."""
    look = gym.make("LookThenAnswer-v0")
    tok = bugfix_gym.Tokenizer(look.unwrapped.words)
    with pytest.raises(ValueError, match=r"policy_kwargs\['max_call_tokens'\]=5 differs from the setting "
                                         r"max_call_tokens=8"):
        Reinforce("TinyAgentPolicy", look, base_agent=None, policy_kwargs=dict(tokenizer=tok, max_call_tokens=5))


@pytest.mark.parametrize("cls", [TokenPPO, Reinforce])
def test_a_loaded_model_writes_the_same_data_as_the_file_it_came_from(cls, tmp_path):
    """Loading and saving again keeps every entry of ``data`` and every tensor (the format is unchanged;
    the characters of a space are now written sorted). The saved arguments are the old ones in today's
    names: TokenPPO's tool-output loss and edit practice settings became two auxiliary-loss specs, and the
    settings added since (the registered policy loss and advantage estimator, the groups and dynamic
    sampling, the GRPO family's settings, the preset's name) are saved at their defaults."""
    path = FIXTURES / f"{cls.__name__.lower()}_main_4e10e0a.zip"
    cls.load(path).save(tmp_path / "again.zip")
    old, new = checkpoint.read(path), checkpoint.read(tmp_path / "again.zip")
    for space in old.data["spaces"].values():
        space["charset"] = "".join(sorted(space["charset"]))
    old_args, new_args = old.data.pop("args"), new.data.pop("args")
    assert new.data == old.data
    legacy = ("tool_coef", "tool_calls", "practice", "practice_tasks")
    added = {"policy_loss": "ppo_clip", "adv_estimator": "gae"} if cls is TokenPPO else \
        {"policy_loss": "reinforce", "adv_estimator": "return_minus_baseline"}
    added.update(group_size=1, drop_zero_variance_groups=False, max_resample_rounds=4, scale_rewards="group",
                 turn_gamma=1.0, step_advantage_weight=1.0, mask_truncated_completions=False, preset=None,
                 episode_baseline="episode")
    if cls is TokenPPO:
        added.update(max_is_weight=5.0, kl_reward_coef=0.0, kl_reward_estimator="k1")
    assert {k: v for k, v in new_args.items() if k not in added and k != "aux_losses"} == \
        {k: v for k, v in old_args.items() if k not in legacy}
    assert {k: new_args[k] for k in added} == added
    if cls is TokenPPO:
        assert new_args["aux_losses"] == [
            {"entry_point": "agents.bugfix.aux_losses:ToolOutputLoss", "kwargs": {"weight": 0.5, "calls": ["edit"]}},
            {"entry_point": "agents.bugfix.aux_losses:EditPracticeLoss",
             "kwargs": {"weight": 0.5, "n": 2, "tasks": "book"}}]
    assert set(new.params) == set(old.params)
    for key in old.params["policy"]:
        assert torch.equal(old.params["policy"][key], new.params["policy"][key]), key


# ---------------------------------------------------------------------- progress, weights files, atomic writes
def test_the_training_progress_travels_through_a_model_file(shared_base_agent, tmp_path):
    model = TokenPPO("TinyAgentPolicy", gym.make("BugFix-v0"), base_agent=shared_base_agent, n_episodes=4, seed=0)
    counters = {"num_timesteps": 96, "n_updates": 12, "iteration": 3, "total_policy_tokens": 700}
    model.set_training_progress({"counters": counters, "state": {"critic_warmed_up": True}})
    assert (model.num_timesteps, model._n_updates, model.iteration, model.total_policy_tokens) == (96, 12, 3, 700)
    model.save(tmp_path / "m.zip")
    assert TokenPPO.load(tmp_path / "m.zip").training_progress() == {"counters": counters,
                                                                     "state": {"critic_warmed_up": True}}


def test_a_weights_file_of_another_format_is_a_one_line_error(shared_base_agent, tmp_path):
    checkpoint.save_state_dict_file(tmp_path / "w.pt", shared_base_agent, "some.format/1")
    loaded = checkpoint.load_state_dict_file(tmp_path / "w.pt", expected_format="some.format/1")
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(),
                                                 shared_base_agent.state_dict().values()))
    assert checkpoint.load_state_dict_file(tmp_path / "w.pt") is not None  # no format asked: any such file
    with pytest.raises(ValueError, match="not a TinyAgent weights file") as e:
        checkpoint.load_state_dict_file(tmp_path / "w.pt", expected_format="other/1")
    assert "\n" not in str(e.value)


def test_a_failed_atomic_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "f.json"
    checkpoint.atomic_write(path, lambda f: f.write(b"old"))

    def half_then_fail(f):
        f.write(b"half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        checkpoint.atomic_write(path, half_then_fail)
    assert path.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["f.json"]


def test_a_parameter_snapshot_puts_back_the_weights_and_only_then_the_optimizer(shared_base_agent):
    model = TokenPPO("TinyAgentPolicy", gym.make("BugFix-v0"), base_agent=shared_base_agent, n_episodes=4, seed=0)
    policy = model.policy
    full, weights = checkpoint.ParameterSnapshot(policy), checkpoint.ParameterSnapshot(policy, with_optimizer=False)
    assert weights.optimizer is None and full.optimizer is not None
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(1.0)
    policy.optimizer.param_groups[0]["lr"] = 0.5
    weights.restore()
    assert all(torch.equal(v, before[k]) for k, v in policy.state_dict().items())
    assert policy.optimizer.param_groups[0]["lr"] == 0.5  # a weights-only snapshot leaves the optimizer
    full.restore()
    assert policy.optimizer.param_groups[0]["lr"] != 0.5
