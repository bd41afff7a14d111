"""A tiny randomly initialised Hugging Face causal LM for a :func:`~.hf_tokenizer.chat_tokenizer`.

A ``LlamaForCausalLM`` of a few hundred thousand parameters: no download, trains on a CPU, and no
dropout anywhere (``attention_dropout=0``; Llama has no other dropout), so a trainer's first-update
ratio is exactly 1 when its sampler and its loss see the same weights.
"""

from __future__ import annotations

from typing import Any


def tiny_causal_lm(tokenizer: Any, hidden: int = 64, layers: int = 2, heads: int = 4, max_positions: int = 2048,
                   seed: int = 0) -> Any:
    """A random-init ``LlamaForCausalLM`` sized for ``tokenizer`` (tied input and output embeddings).

    :param tokenizer: gives the vocabulary size and the pad / EOS ids
    :param hidden: the model width (a multiple of ``heads``)
    :param layers: decoder blocks
    :param heads: attention heads
    :param max_positions: the longest sequence (prompt, model turns and tool outputs together)
    :param seed: torch's seed for the initial weights
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if hidden % heads:
        raise ValueError(f"hidden ({hidden}) must be a multiple of heads ({heads})")
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
                         max_position_embeddings=max_positions, attention_dropout=0.0, tie_word_embeddings=True,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                         bos_token_id=None)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model
