"""Rollouts: trajectories and collate, the episode sampler that drives any SB3 VecEnv of text
envs in lockstep, and the vector envs (a text DummyVecEnv, Ray actors). Knows no BugFix task.
"""
