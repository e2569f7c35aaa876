"""Sandpit's HTTP API (FastAPI), in layers; each imports only from its own and those below.

::

    settings.py errors.py metrics.py secrets.py json_rules.py
                      the foundation: settings (quotas included), the exception tree and
                      the one error -> HTTP status table (plain data), metrics and the step
                      clock, stored-secret encryption, the JSON rules of the edge and the store
    schemas/          request and response models, one module per resource (the contract)
    db/               engine and migration gate, the unit of work, tables, the snapshot store
                      (store, state_trees, state_blobs), configs, the group commit and its
                      step writer (step_writes), idempotency keys, attempt fences
    sandboxes.py      the executor seam: the one adapter over ``Executor``/``ExecutorSession``
                      (slots of the fair scheduler, executor errors translated)
    services/         registries: environments, scenarios, tenants, quotas, execution
                      (validate, execute), checks, model endpoints, health, cluster,
                      stats (per-scenario statistics), idempotency (Idempotency-Key),
                      ui_sessions (the web viewer's sign-in sessions)
    envs/             an env's lifecycle, one concept a module, one method per verb taking
                      the caller's ``TenantContext``: lifecycle (create, read, list, delete,
                      expire, collect), episodes (reset, restore, fork), steps, rewards
                      (score, evaluate), history, attempts (resume, the attempt fence);
                      and sessions, live, rulebook, users,
                      actions, envscaler, outcomes, configs, views, state; listings (the
                      web viewer's episode and environment listings)
    evaluations/      batch evaluation jobs, their runner (a client of the env verbs),
                      claims across replicas, the rollout agent loop, listings (an
                      evaluation's episodes paged and its reward histogram, for the viewer)
    http/             the only HTTP code: deps, routes/ (one module per resource), the doors
                      in front of the router (step, batch_step, create_env, reset_env) and
                      the request shapes they check as FastAPI does (shapes),
                      the MCP servers (mcp), the OpenEnv protocol (openenv),
                      strict JSON bodies, the body deadline, the OpenAPI document, the access log, exception handlers,
                      the step's spare-CPU gate (spare_cpu),
                      the web viewer (ui/: server-rendered pages under /ui over the services above)
    app.py            the composition root: builds the executor, the database and every
                      service; the doors in front of FastAPI

Import rules (``tests/unit/api/test_import_rules.py`` checks them):

1. Layers, lowest first: the foundation; ``schemas`` and ``db`` (which do not import each
   other); ``sandboxes`` (and the fair scheduler beside it); ``services``; ``envs``;
   ``evaluations``; ``http``; ``app``. Nothing imports from a layer above its own, and
   there is no import cycle.
2. ``http/routes`` import only ``http.deps``, ``schemas``, ``services`` and ``envs``.
3. Only ``sandboxes`` (with the scheduler) and ``app`` import ``sandpit.executor``;
   ``schemas`` may import ``sandpit.executor.profiles`` (pure models) for the bounds of
   profile values. Only ``http`` and ``app`` import the web framework.
4. ``import sandpit.api.settings`` loads no ``sandpit.executor``, no
   ``sandpit.sandbox_images`` and no FastAPI module.
5. Nothing in ``api`` imports ``sandpit.client`` or ``sandpit.importers`` (clients of the
   API), except ``sandpit.client.llm``: the one OpenAI-compatible model client, which the
   rollouts and the simulated user use.
6. No module reaches into another object's privates (``x._name`` with ``x`` not
   ``self``/``cls``); no module is over 600 lines.
"""
