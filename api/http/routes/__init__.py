"""HTTP routes, one module per resource (thin: parse, call one service method, return a schema)."""
