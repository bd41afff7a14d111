"""``bugfix-gym serve DIR`` with BugFix-v1's typed tools: a folder's LM (its chat template) writes a v1 tool call
that the server reads back with the response template, ``call_of_tool_call_v1`` turns into the call BugFix-v1 plays,
and a chat client's request with ``tool_schemas_v1()`` is answered (``make test-trl``; skipped without
transformers)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from agents.cli.serve import serving  # noqa: E402
from agents.cli.serve_hf import HFAnswer, load_served  # noqa: E402
from bugfix_gym.core.env_v1 import BugFixEnvV1  # noqa: E402
from bugfix_gym.integrations.chat_v1 import call_of_tool_call_v1, tool_schemas_v1  # noqa: E402
from bugfix_gym.integrations.dump_v1 import v1_chat_tokenizer  # noqa: E402
from bugfix_gym.integrations.hf_model import tiny_causal_lm  # noqa: E402
from tests.test_serve import _request  # noqa: E402

torch.set_num_threads(1)
TASK = "has_close_elements~0"  # HumanEval/0 of the test split, repaired by edit 4.1 swap


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    tokenizer = v1_chat_tokenizer()
    path = tmp_path_factory.mktemp("v1folder") / "model"
    tiny_causal_lm(tokenizer, seed=0).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.mark.parametrize("written, call", [
    ("<call>edit line=4 expr=1 mutation=swap</call>", "edit 4.1 swap"),
    ("<call>edit line=12 expr=3 mutation=op arg=<=</call>", "edit 12.3 op <="),
    ("<call>locate</call>", "locate"),
    ("<call>delete line=3</call>", "delete 3"),
])
def test_a_served_folder_reads_a_v1_tool_call_back_as_the_call_bugfix_v1_plays(folder, written, call):
    model = load_served(folder)
    ids = model.tok.hf.encode(written, add_special_tokens=False) + [model.tok.hf.eos_token_id]
    assert model.tok.hf.unk_token_id not in ids
    prompt = model.encode([{"role": "user", "content": "fix it"}])
    (function,) = model.tool_calls(HFAnswer(ids, model.tok.decode(ids), [0.0] * len(ids), True), prompt)
    assert call_of_tool_call_v1({"function": function}) == call


def test_the_repair_written_by_a_served_folder_fixes_the_task_and_a_client_gets_answers(folder):
    model = load_served(folder)
    ids = model.tok.hf.encode("<call>edit line=4 expr=1 mutation=swap</call>", add_special_tokens=False)
    prompt = model.encode([{"role": "user", "content": "fix it"}])
    (function,) = model.tool_calls(HFAnswer(ids, "", [0.0] * len(ids), True), prompt)
    env = BugFixEnvV1(split="test")
    obs, info = env.reset(options={"task": TASK})
    env.step(call_of_tool_call_v1({"function": function}))
    assert env.step("submit")[1] == 1.0
    with serving(folder, "m", log_requests=False) as server:  # an untrained LM: the answer's shape, not its call
        status, answer = _request(server.url + "/chat/completions", dict(
            model="m", messages=[{"role": "user", "content": obs}], tools=tool_schemas_v1(), seed=0, max_tokens=8))
    assert status == 200, answer
    message = answer["choices"][0]["message"]
    for tool_call in message.get("tool_calls") or []:
        assert isinstance(call_of_tool_call_v1(tool_call), str)
    assert json.dumps(answer) and answer["choices"][0]["finish_reason"] in ("stop", "length", "tool_calls")
