"""Decoding: the legal-call grammar, foresight, and the call decoder that writes one call per
row of a batch with the KV cache. Depends on the model only (and the token contract).
"""
