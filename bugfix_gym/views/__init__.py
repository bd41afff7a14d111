"""What other libraries and people see of the envs: the array views (:mod:`.wrappers`), the text
wrappers ``gym.make`` applies (:mod:`.text_wrappers`) and terminal play (:mod:`.play`)."""
