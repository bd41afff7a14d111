"""Generic token-level RL: losses, advantages, the rollout buffer, the SB3 policy, the on-policy
core, REINFORCE and TokenPPO, and generic callbacks. Any text env with the token contract.
"""
