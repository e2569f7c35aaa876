"""Sandbox executor: runs untrusted environment code in hardened Docker containers."""
