"""The network: TinyAgent, a small decoder-only transformer with a policy (language-model) head
and a value head, and its packed KV cache. Knows nothing of environments or training.
"""
