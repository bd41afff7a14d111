"""BugFix-specific training aids: the base agent, edit practice, recipes and the evaluator on
BugFix tasks. The only agents layer that may import the BugFix env and tasks.
"""
