"""Registries and resources below the env lifecycle: environments, scenarios, tenants and
their quotas, validation and execution of code, check functions in sandboxes, model
endpoints, health, the cluster view. Routes and the env verbs (:mod:`sandpit.api.envs`)
call these; they reach the database through :class:`~sandpit.api.db.database.Database`
and untrusted code only through :class:`~sandpit.api.sandboxes.Sandboxes`, and import
nothing of ``envs``, ``evaluations`` or ``http``."""
