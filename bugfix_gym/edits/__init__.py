"""Source edits: BugFix-v0's five repair ops (:mod:`.ops`, which also inject the defects)."""
