"""What the API does, one module per resource; routes call these, and these return the
schemas routes answer with. Services reach the database through
:class:`~sandpit.api.db.database.Database` and untrusted code only through
:class:`~sandpit.api.sandboxes.Sandboxes`."""
