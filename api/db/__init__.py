"""Persistence: the engine and migration gate (:mod:`.engine`), the unit of work
(:mod:`.database`), the tables (:mod:`.models`), the content-addressed snapshot store
(:mod:`.store`, :mod:`.state_trees`, :mod:`.state_blobs`) with its garbage collection,
configs stored once (:mod:`.configs`), and the group commit (:mod:`.group_commit`) with
its step writer (:mod:`.step_writes`). Nothing here knows HTTP, services or envs."""
