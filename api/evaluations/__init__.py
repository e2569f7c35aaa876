"""Rewards and evaluations: running check functions and EnvScaler's reward
(:mod:`.rewards`), batch evaluation jobs (:mod:`.jobs`) and their background runner
(:mod:`.runner`), and the rollout agent loop against a model endpoint (:mod:`.rollout`)."""
