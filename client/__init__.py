"""Sandpit's Python client: the HTTP API client and the model client.

* :mod:`sandpit.client.llm`: the one OpenAI-compatible model client of the code base
  (chat completions and embeddings with retries, usage and an optional cache).
"""
