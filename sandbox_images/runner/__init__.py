"""The in-sandbox runner: a stdlib-only package copied into the image (``COPY runner/``).

A file's name says which process its code runs in:

* ``pid1_*``: PID 1 of the sandbox, trusted, never executes environment code. Each
  imports only those before it in this list: ``pid1_cleanup`` (killing leftovers,
  proving the sandbox empty before reuse), ``pid1_loop`` (the event loop: selector,
  deadlines, deferred actions), ``pid1_host`` (the host channel), ``pid1_children`` (the
  process table: spare, spawn, reap, sweep), ``pid1_configs`` (the cache of configs by
  digest), ``pid1_templates`` (processes forked from warm templates), ``pid1_replies``
  (what PID 1 takes from a session process's replies), ``pid1_groups`` (several
  sessions' calls in one frame each way), ``pid1_sessions`` (one environment instance
  per session) and ``pid1_jobs`` (one-shot jobs: scripts and check batches), then
  ``pid1_runner`` (start-up, host dispatch, recycle).
* ``child_*``: the processes where untrusted code runs (so everything they hold is within
  its reach): ``child_spare`` (where each starts: confined, then it becomes a session, a
  job or a template), ``child_session`` (one environment instance), ``child_instance``
  (loading the class, making the instance), ``child_template`` (a module executed once,
  forked for sessions), ``child_oneshot`` (a script or a check batch), ``child_checks``
  and ``child_restore`` (a check batch's zygote, the states it restores),
  ``child_readonly`` (which checks provably only read, so they may share the batch's
  process), ``child_schemas`` and ``child_docstrings`` (tool schemas by introspection),
  ``child_render`` (the JSON rendering of state), ``child_delta`` (path deltas of large
  attributes), ``child_codec`` (the JSON codec bound before untrusted code runs),
  ``child_standins`` (pickles restored without their classes), ``child_confine`` (the
  seccomp filter).
* shared by both sides and by the host: ``protocol`` (framing), ``limits`` (every size,
  count and time cap) and ``wire`` (the rules and texts both sides of the boundary apply:
  encoded state entries, tags, tool names, the JSON depth scan, error texts). The host
  imports nothing else of the runner.

One package with relative imports. The image installs it as ``sandpit_runner`` in
``/opt/sandpit`` (the Dockerfile), and PID 1 starts with ``from sandpit_runner import
pid1_runner``; ``/opt/sandpit`` is on ``sys.path`` only while a process imports the
runner: a spawned process takes it off before anything untrusted runs
(``child_spare.main``), so untrusted code finds no runner module on its path. On the
host the package is ``sandpit.sandbox_images.runner``, imported only for constants and
pure helpers, never to run anything untrusted. No name may shadow a standard-library
module (``tests/unit/runner/test_runner_files.py``).
"""
