"""An env's life: instances of environments in sandboxes, their episodes and steps.

Verbs (each takes the caller's :class:`~sandpit.api.services.quotas.TenantContext`)::

    lifecycle.EnvLifecycle   create, read, page, delete; close_expired (janitor)
    episodes.Episodes        reset, restore, fork
    steps.Steps              step
    rewards.Rewards          evaluate (and score: an episode's reward at its end)
    history.EnvHistory       state, trajectory, episodes
    attempts.Attempts        resume (a new attempt), the fence of a stale attempt's calls

What they share: ``sessions`` (live entries, attach, open with eviction, new episodes),
``live`` (the live-session cache, per-env locks, the janitor), ``rulebook`` (what an
episode is and how one starts), ``users`` (the simulated user), ``actions`` (parsing an
action, the tools' argument checks), ``envscaler`` (EnvScaler's rulebook), ``outcomes``
(what a step did and its reply), ``configs``, ``views`` (``EnvPublic``), ``state`` (the
state's JSON view).
"""
