"""``bugfix-gym serve DIR``: a ``save_pretrained`` folder (what ``examples/trl_grpo.py`` saves as ``grpo/model``, a
TRL output) served through its own chat template, with its files read as data and checked as model files are
(``make test-trl``; skipped without transformers)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

pytest.importorskip("tokenizers")
transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

import gymnasium as gym  # noqa: E402

from agents.cli import main  # noqa: E402
from agents.cli.serve import serving  # noqa: E402
from bugfix_gym.integrations.chat import tool_schemas  # noqa: E402
from bugfix_gym.integrations.conformance import load_tokenizer  # noqa: E402
from bugfix_gym.integrations.hf_checkpoint import TextTokenizer, check_safetensors, read_tokenizer  # noqa: E402
from bugfix_gym.integrations.hf_model import tiny_causal_lm  # noqa: E402
from bugfix_gym.integrations.hf_tokenizer import ChatTemplateTokenizer, call_ids, chat_tokenizer  # noqa: E402
from tests.test_serve import _request  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """A tiny Llama and the chat tokenizer, saved as TRL's trainer saves them."""
    tokenizer = chat_tokenizer()
    lm = tiny_causal_lm(tokenizer, seed=0)
    path = tmp_path_factory.mktemp("folder") / "model"
    lm.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_a_folder_serves_through_its_chat_template_with_token_ids_and_top_logprobs(folder):
    prompt = gym.make("BugFix-v0").reset(seed=1)[0]
    with serving(folder, "m", log_requests=False) as server:
        status, answer = _request(server.url + "/chat/completions", dict(
            model="m", messages=[{"role": "user", "content": prompt}], tools=tool_schemas(), temperature=1.0,
            seed=0, n=2, max_tokens=12, logprobs=True, top_logprobs=3, return_token_ids=True))
        assert status == 200, answer
        tok = server.agent.tok
        expected = tok.hf.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                              tokenize=True, return_dict=False)
        assert answer["prompt_token_ids"] == list(expected)  # the template's ids, as TRL renders a prompt
        for choice in answer["choices"]:
            assert 1 <= len(choice["token_ids"]) <= 12 and choice["finish_reason"] in ("stop", "length", "tool_calls")
            for token, entry in zip(choice["token_ids"], choice["logprobs"]["content"]):
                top = entry["top_logprobs"]
                assert len(top) == 3 and entry["logprob"] <= top[0]["logprob"] + 1e-6
            assert abs(answer["usage"]["completion_tokens"] - sum(len(c["token_ids"]) for c in answer["choices"])) == 0
        status, tokenized = _request(server.url.replace("/v1", "/tokenize"), dict(
            model="m", messages=[{"role": "user", "content": prompt}]))
        assert tokenized["tokens"] == list(expected) and tokenized["max_model_len"] == 2048


def test_a_folder_reads_back_a_tool_call_with_the_response_template(folder):
    """The model's call ids (what the SFT teaches), parsed into an OpenAI tool call; a chat with an assistant
    tool call renders it back into the same ids, so the next turn sees what the model wrote."""
    from agents.cli.serve_hf import HFAnswer, load_served

    model = load_served(folder)
    ids = call_ids(model.tok.hf, "edit", "fix_init")
    answer = HFAnswer(ids, model.tok.decode(ids), [0.0] * len(ids), True)
    prompt = model.encode([{"role": "user", "content": "fix it"}])
    assert model.tool_calls(answer, prompt) == [{"name": "edit", "arguments": json.dumps({"op": "fix_init"})}]
    chat = [{"role": "user", "content": "fix it"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
                "name": "edit", "arguments": json.dumps({"op": "fix_init"})}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "changed line 2"}]
    rendered = model.encode(chat)
    first = model.encode(chat[:1])
    assert rendered[:len(first)] == first and rendered[len(first):len(first) + len(ids)] == ids


def _copy(folder: Path, target: Path) -> Path:
    target.mkdir()
    for f in folder.iterdir():
        (target / f.name).write_bytes(f.read_bytes())
    return target


@pytest.mark.parametrize("damage, error", [
    ("no config", "holds no config.json"),
    ("pickle only", "pickled weights are not read"),
    ("header too long", "its header claims"),
    ("float64", "has dtype 'F64'"),
    ("gap", "not what its shape and dtype need"),
    ("huge config", "parameters"),
    ("remote code", "remote code"),
    ("wrong shape", "has shape"),
])
def test_a_damaged_folder_is_one_line_and_exit_2(folder, tmp_path, capsys, damage, error):
    path = _copy(folder, tmp_path / "m")
    weights = path / "model.safetensors"
    blob = weights.read_bytes()
    (size,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + size])
    config = json.loads((path / "config.json").read_text())

    def rewrite(h: dict) -> None:
        text = json.dumps(h).encode()
        weights.write_bytes(struct.pack("<Q", len(text)) + text + blob[8 + size:])

    if damage == "no config":
        (path / "config.json").unlink()
    elif damage == "pickle only":
        weights.rename(path / "pytorch_model.bin")
    elif damage == "header too long":
        weights.write_bytes(struct.pack("<Q", 10**9) + blob[8:])
    elif damage == "float64":
        key = next(k for k in header if k != "__metadata__")
        header[key]["dtype"] = "F64"
        rewrite(header)
    elif damage == "gap":
        key = next(k for k in header if k != "__metadata__")
        header[key]["shape"] = [1]
        rewrite(header)
    elif damage == "huge config":
        config.update(hidden_size=65536, intermediate_size=262144, num_hidden_layers=64)
        (path / "config.json").write_text(json.dumps(config))
    elif damage == "remote code":
        config["auto_map"] = {"AutoModelForCausalLM": "evil.Model"}
        (path / "config.json").write_text(json.dumps(config))
    elif damage == "wrong shape":
        config.update(intermediate_size=96)
        (path / "config.json").write_text(json.dumps(config))
    assert main(["serve", str(path), "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bugfix-gym serve: error:") and error in err and len(err.splitlines()) == 1, err


def test_check_safetensors_accepts_what_save_pretrained_writes(folder):
    header = check_safetensors((folder / "model.safetensors").read_bytes(), "m")
    assert all(v["dtype"] == "F32" for k, v in header.items() if k != "__metadata__")


def test_conformance_reads_a_tokenizer_json_and_a_save_pretrained_folder(folder, tmp_path):
    from_folder = load_tokenizer(str(folder))
    assert isinstance(from_folder, ChatTemplateTokenizer) and from_folder.eoc_id == chat_tokenizer().eos_token_id
    plain = load_tokenizer(str(folder / "tokenizer.json"))
    assert isinstance(plain, TextTokenizer)
    ids = from_folder.encode("edit fix_init")
    assert plain.encode("edit fix_init") == ids and plain.decode(ids) == "edit fix_init"
    assert read_tokenizer(folder).segment_ids(3, "no change")[-2:] == from_folder.segment_ids(3, "read")[-2:]
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no tokenizer.json"):
        load_tokenizer(str(tmp_path / "empty"))


def test_a_trainer_output_with_checkpoints_names_the_latest_and_the_context_is_bounded(folder, tmp_path, capsys):
    out = tmp_path / "grpo"  # a Trainer's output_dir: checkpoint-N folders, no model of its own
    out.mkdir()
    for step in (5, 40, 120):
        _copy(folder, out / f"checkpoint-{step}")
    assert main(["serve", str(out), "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "holds no config.json" in err and f"its latest checkpoint is {out / 'checkpoint-120'}" in err
    assert main(["serve", str(folder), "--port", "0", "--max-model-len", "4096"]) == 2
    assert "--max-model-len 4096 is beyond the model's 2048 positions" in capsys.readouterr().err
    assert main(["serve", str(folder), "--port", "0", "--foresight", "0.5"]) == 2
    assert "answers through its chat template: drop them" in capsys.readouterr().err
