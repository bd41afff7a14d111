"""Crafted model files: every kind the audit tried is refused in one line before it costs anything."""

from __future__ import annotations

import io
import json
import zipfile

import gymnasium as gym
import pytest
import torch

import bugfix_gym  # noqa: F401
from agents.algorithms.ppo import TokenPPO
from agents.cli import main
from agents.files import checkpoint


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory, shared_base_agent):
    path = tmp_path_factory.mktemp("model") / "m.zip"
    TokenPPO("TinyAgentPolicy", gym.make("BugFix-v0"), base_agent=shared_base_agent, n_episodes=4, seed=0).save(path)
    return path


def _crafted(saved, tmp_path, edit_data=None, edit_policy=None, raw_data=None):
    entries = {}
    with zipfile.ZipFile(saved) as archive:
        for name in archive.namelist():
            entries[name] = archive.read(name)
    if edit_data is not None:
        data = json.loads(entries["data"])
        edit_data(data)
        entries["data"] = json.dumps(data).encode()
    if raw_data is not None:
        entries["data"] = raw_data(entries["data"].decode()).encode()
    if edit_policy is not None:
        state = torch.load(io.BytesIO(entries["policy.pth"]), weights_only=True)
        state = edit_policy(state)
        buf = io.BytesIO()
        torch.save(state, buf)
        entries["policy.pth"] = buf.getvalue()
    path = tmp_path / "crafted.zip"
    with zipfile.ZipFile(path, "w") as archive:
        for name, blob in entries.items():
            archive.writestr(name, blob)
    return path


def _config(data, **sizes):
    data["policy_kwargs"]["model_config"].update(sizes)


def _first_nan(state):
    key = next(k for k, t in state.items() if t.is_floating_point())
    state[key] = state[key].clone().fill_(float("nan"))
    return state


CRAFTED = {
    "state as a list": dict(edit_data=lambda d: d.update(state=[])),
    "spaces as a list": dict(edit_data=lambda d: d.update(spaces=[])),
    "args as a list": dict(edit_data=lambda d: d.update(args=[])),
    "policy_kwargs as a list": dict(edit_data=lambda d: d.update(policy_kwargs=[])),
    "model_config as a list": dict(edit_data=lambda d: d["policy_kwargs"].update(model_config=[])),
    "num_timesteps Infinity": dict(raw_data=lambda t: t.replace('"num_timesteps": 0', '"num_timesteps": Infinity')),
    "n_head 0": dict(edit_data=lambda d: _config(d, n_head=0)),
    "n_head negative": dict(edit_data=lambda d: _config(d, n_head=-4)),
    "805M parameters": dict(edit_data=lambda d: _config(d, d_model=4096, n_layer=4, d_ff=16384, n_head=8)),
    "hf_config as a list": dict(edit_data=lambda d: d["policy_kwargs"].update(hf_config=[])),
    "hf_config of 70B parameters": dict(edit_data=lambda d: d["policy_kwargs"].update(hf_config=dict(
        model_type="llama", vocab_size=128256, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80))),
    "hf_config the weights do not fit": dict(edit_data=lambda d: d["policy_kwargs"].update(hf_config=dict(
        model_type="llama", vocab_size=230, hidden_size=32, intermediate_size=64, num_hidden_layers=1))),
    "integer state-dict keys": dict(edit_policy=lambda s: {i: t for i, t in enumerate(s.values())}),
    "NaN weights": dict(edit_policy=_first_nan),
    "n_episodes 1e30": dict(edit_data=lambda d: d["args"].update(n_episodes=1e30)),
    "an escape sequence in the algorithm": dict(edit_data=lambda d: d.update(algorithm="\x1b]0;owned\x07")),
    # the audit's three TinyAgent files: serve started and refused every chat; sampling divided by 0 in float32
    "max_call_tokens 1,000,000": dict(edit_data=lambda d: d["policy_kwargs"].update(max_call_tokens=1_000_000)),
    "max_call_tokens 1,000,000 in args": dict(edit_data=lambda d: d["args"].update(max_call_tokens=1_000_000)),
    "temperature 1e-300": dict(edit_data=lambda d: d["args"].update(temperature=1e-300)),
    "an HF tokenizer without transformers": dict(edit_data=lambda d: d["policy_kwargs"].update(tokenizer=_hf_tok())),
}


def _hf_tok() -> dict:
    """A saved chat-template tokenizer's shape (read only where transformers is missing: see the test)."""
    from bugfix_gym.integrations.hf_tokenizer import HF_FORMAT

    return {"format": HF_FORMAT, "tokenizer_json": "{}", "chat_template": "", "end_token": "<|end|>",
            "eos_token": "<|end|>", "pad_token": None, "unk_token": None, "bos_token": None, "tool_name": "bugfix"}


@pytest.mark.parametrize("kind", CRAFTED)
def test_a_crafted_model_file_is_one_line(saved_model, tmp_path, capsys, kind):
    if kind == "an HF tokenizer without transformers":
        try:
            import transformers  # noqa: F401
            pytest.skip("transformers is installed: the tokenizer is read (tests/test_hf_files.py)")
        except ImportError:
            pass
    path = _crafted(saved_model, tmp_path, **CRAFTED[kind])
    with pytest.raises(ValueError) as caught:
        TokenPPO.load(path)
    assert "\n" not in str(caught.value) and "\x1b" not in str(caught.value) and "\x07" not in str(caught.value)
    assert main(["eval", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and "\x1b" not in err
    assert main(["serve", str(path), "--port", "0"]) == 2  # refused before it listens, not at every chat
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("bugfix-gym serve: error:")


def test_a_large_model_config_is_refused_before_allocating(saved_model, tmp_path, monkeypatch):
    def no_model(*args, **kwargs):
        raise AssertionError("a model was built")

    monkeypatch.setattr(checkpoint, "_load_tensors", no_model)  # refused before even the weights are unpickled
    path = _crafted(saved_model, tmp_path, **CRAFTED["805M parameters"])
    with pytest.raises(checkpoint.ModelFileError, match="asks for 8"):
        checkpoint.read(path)


def test_the_parameter_estimate_never_exceeds_a_real_model(saved_model):
    model = TokenPPO.load(saved_model)
    config = model.policy_kwargs["model_config"]
    actual = sum(p.numel() for p in model.policy.model.parameters())
    assert 0.9 * actual < checkpoint.estimated_parameters(config) <= actual


def test_a_zip_with_many_entries_is_refused_before_its_names_are_read(tmp_path, monkeypatch):
    path = tmp_path / "many.zip"
    with zipfile.ZipFile(path, "w") as archive:
        for i in range(5000):
            archive.writestr(f"e{i}", b"")

    def no_names(self, *args, **kwargs):
        raise AssertionError("the central directory was read")

    monkeypatch.setattr(zipfile.ZipFile, "_RealGetContents", no_names)
    with pytest.raises(checkpoint.ModelFileError, match="declares 5000 entries"):
        checkpoint.read(path)
