"""Sandpit's HTTP API (FastAPI), in layers.

::

    app.py            the app factory: builds the executor, the database and every service
    routes/           one module per resource; each route parses, calls one service method,
                      returns a schema
    deps.py           typed dependencies of routes (``EnvsDep``, ``CallerDep``, ``PageDep``...)
    schemas/          request and response models, one module per resource (the contract)
    services/         what the API does, one module per resource (environments, envs,
                      steps, live sessions, episodes, scenarios, execution, tenants, quotas)
    evaluations/      rewards (checks, EnvScaler reward), batch evaluation jobs, their
                      runner, the rollout agent loop
    db/               engine and migration gate, the unit of work, tables, snapshot store
    sandboxes.py      the executor seam: the one adapter over ``Executor``/``ExecutorSession``
                      (slots of the fair scheduler, executor errors translated)
    errors.py         the exception tree and the one error -> HTTP status table

Import rules (``tests/unit/api/test_import_rules.py`` checks them):

1. ``routes`` import only ``deps``, ``schemas`` and ``services`` (of Sandpit's modules).
2. Only ``sandboxes`` and ``app`` import ``sandpit.executor``.
3. ``schemas`` import nothing from ``services``, ``db`` or ``routes``.
4. ``db`` imports nothing from ``routes``, ``services`` or ``evaluations``.
5. Nothing in ``api`` imports ``sandpit.client`` or ``sandpit.importers`` (clients of the
   API), except ``sandpit.client.llm``: the one OpenAI-compatible model client, which the
   rollouts and the simulated user use.
6. No module reaches into another object's privates (``x._name`` with ``x`` not
   ``self``/``cls``).
"""
