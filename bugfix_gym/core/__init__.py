"""BugFix-v0: the environment (:mod:`.env`), its call grammar and words (:mod:`.tools`), its vocabularies
(:mod:`.vocabulary`), scripted policies (:mod:`.scripted`), the evaluator (:mod:`.evaluation`) and the
LookThenAnswer toy env (:mod:`.look`)."""
