"""BugFix-specific training aids: the base agent, edit practice, recipes and the evaluator on
BugFix tasks. The only agents layer that may import the BugFix env and tasks.

Importing the layer registers BugFix-v0's episode statistics (:func:`bugfix_gym.episode_stats`) with
the rollout layer, so the rollouts of BugFix-v0 are summarised by pass rate, valid calls and behaviour.
"""

from bugfix_gym.evaluation import episode_stats

from agents.rollout.trajectory import register_episode_summary


def _is_bugfix_info(info: dict) -> bool:
    """Whether a final ``info`` is a BugFix-v0 episode's (it has the keys :func:`episode_stats` reads)."""
    return "submitted" in info and "n_turns" in info


register_episode_summary(_is_bugfix_info, episode_stats)
