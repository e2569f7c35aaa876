"""Backend-neutral placement of sessions into sandboxes: the warm pool, admission, recycling
and one-shot jobs (:class:`~sandpit.executor.pool.pool.SandboxPool`), the host-side session
handle (:mod:`.session`), the placement protocol between them (:mod:`.placement`), repeated
configs (:mod:`.configs`), one-shot job checks (:mod:`.jobs`) and the runner protocol's host
end (:mod:`.channel`)."""
