"""EnvScaler-style synthesis (arXiv 2601.05808) as a client of the Sandpit API.

SkelBuilder (:mod:`.skel`) turns seed tasks into quality-checked environment classes;
ScenGenerator (:mod:`.scen`) gives each kept environment scenarios with validated check
functions; :mod:`.pipeline` runs the stages over a resumable run directory
(:mod:`.rundir`); :mod:`.llm` is the cached, retried model access; prompts are versioned
templates (:mod:`.prompts`, ``prompts/*.md``). Generated code is never executed here: it
is parsed (``ast``), statically checked, and sent to the API, whose sandboxes run it.
"""
