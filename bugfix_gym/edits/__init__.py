"""Source edits: BugFix-v0's five repair ops (:mod:`.ops`, which also inject the defects) and BugFix-v1's edits:
the sited mutations (:mod:`.sites` the vocabularies, sites and legal set; :mod:`.mutations` applying one), the
line patches (:mod:`.patches`), bug injection (:mod:`.inject`) and the defect-class table (:mod:`.defect_classes`)."""
