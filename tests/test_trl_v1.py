"""BugFix-v1 with the real TRL (``make test-trl``; skipped where trl / transformers are missing): the typed tools as
TRL describes them, and a v1 conformance dump from TRL's own GRPOTrainer that passes ``--strict``."""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("transformers")
pytest.importorskip("datasets")
pytest.importorskip("trl")
torch = pytest.importorskip("torch")

from bugfix_gym.core.calls_v1 import CALL_KINDS  # noqa: E402
from bugfix_gym.integrations.chat_v1 import tool_schemas_v1  # noqa: E402
from bugfix_gym.integrations.trl_v1 import BugFixToolEnvV1  # noqa: E402

torch.set_num_threads(1)
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def test_trl_describes_each_tool_method_as_the_shared_chat_schema_does():
    from transformers.utils import get_json_schema

    env = BugFixToolEnvV1()
    for shared in tool_schemas_v1():
        name = shared["function"]["name"]
        described = get_json_schema(getattr(env, name))["function"]["parameters"]
        params = shared["function"]["parameters"]
        assert list(described.get("properties", {})) == list(params["properties"]), name
        assert described.get("required", []) == params["required"], name
        for arg, spec in params["properties"].items():
            assert described["properties"][arg]["type"] == spec["type"], (name, arg)
    methods = {n for n in dir(env) if not n.startswith("_") and callable(getattr(env, n))}
    assert methods - {"reset", "get_reward"} == set(CALL_KINDS)


def test_a_v1_dump_from_trl_s_grpo_trainer_passes_conformance_strict(tmp_path, capsys):
    from bugfix_gym.integrations.conformance import main as conformance
    from bugfix_gym.integrations.dump_v1 import write_v1_dump

    dump = tmp_path / "v1_first.jsonl"
    folder = write_v1_dump(dump, n_rows=2, num_generations=2, seed=0)
    episodes = [json.loads(line) for line in dump.read_text().splitlines()]
    assert len(episodes) == 4 and sorted(e["reward"] for e in episodes) == [0.0, 0.0, 1.0, 1.0]
    capsys.readouterr()
    assert conformance([str(dump), "--tokenizer", str(folder), "--strict"]) == 0
    report = capsys.readouterr().out
    assert "FAIL" not in report and report.count("pass ") >= 12, report
    from transformers import AutoTokenizer

    text = AutoTokenizer.from_pretrained(str(folder)).decode(episodes[0]["completion_ids"])
    assert "<|assistant|>locate<|end|><|tool|>" in text and "  1| " in text and "hidden tests" in text  # v1's tools


def test_grpo_trainer_takes_the_v1_tool_env_as_its_environment_factory(tmp_path):
    from trl import GRPOConfig, GRPOTrainer

    from bugfix_gym.integrations.dump_v1 import v1_chat_tokenizer
    from bugfix_gym.integrations.hf_model import tiny_causal_lm
    from bugfix_gym.integrations.trl_v1 import make_dataset_v1

    tokenizer = v1_chat_tokenizer()
    config = GRPOConfig(output_dir=str(tmp_path / "grpo"), per_device_train_batch_size=4, num_generations=2,
                        max_completion_length=48, max_steps=1, learning_rate=1e-3, beta=0.0, top_k=0,
                        save_strategy="no", report_to="none", use_cpu=True, seed=0, log_completions=False,
                        bf16=False, loss_type="dapo", max_tool_calling_iterations=3)
    trainer = GRPOTrainer(model=tiny_causal_lm(tokenizer, seed=0, max_positions=4096), args=config,
                          train_dataset=make_dataset_v1("test", n=4, seed=5), processing_class=tokenizer,
                          reward_funcs=[], environment_factory=BugFixToolEnvV1)
    trainer.train()
    assert trainer.state.global_step == 1
    assert {tool.__name__ for tool in trainer.tools} == set(CALL_KINDS)  # TRL probed the nine typed tools
