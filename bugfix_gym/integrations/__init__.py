"""Adapters for LLM-agent trainers, and the checks their batches should pass.

Nothing here is imported by ``import bugfix_gym``, and no module of this package imports a trainer
library at import time: ``bugfix_gym.integrations.conformance`` needs only numpy,
``bugfix_gym.integrations.trl`` imports ``datasets`` inside :func:`~bugfix_gym.integrations.trl.make_dataset`
only, and ``bugfix_gym.integrations.hf_tokenizer`` needs ``tokenizers`` / ``transformers`` when called.
docs/llm_trainers.md says how to use each.
"""
