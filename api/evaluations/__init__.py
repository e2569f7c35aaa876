"""Batch evaluations: jobs (:mod:`.jobs`), their background runner (:mod:`.runner`, a
client of the env verbs of :mod:`sandpit.api.envs`), exactly-once claims across API
replicas (:mod:`.claims`), and the rollout agent loop against a model endpoint
(:mod:`.rollout`). Episode rewards are :mod:`sandpit.api.envs.rewards`'."""
