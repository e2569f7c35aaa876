"""Persistence: the engine and migration gate (:mod:`.engine`), the unit of work
(:mod:`.database`), the tables (:mod:`.models`) and the content-addressed snapshot store
with its garbage collection (:mod:`.store`). Nothing here knows HTTP routes or services."""
