"""An env's life: instances of environments in sandboxes, their episodes and steps."""
