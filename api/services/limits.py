"""The server-wide size caps of code and ``init_config`` (``ApiSettings``; 413). A
tenant's own, lower quotas are :mod:`.quotas`' (429)."""

from __future__ import annotations

from typing import Any

from ..errors import InvalidRequest, PayloadTooLarge
from ..json_rules import json_size, text_size
from ..settings import ApiSettings


def check_code(settings: ApiSettings, source_code: str, field: str = "source_code") -> None:
    """Raises PayloadTooLarge (over ``max_code_bytes``), InvalidRequest (a NUL byte)."""
    size = text_size(source_code)
    if size > settings.max_code_bytes:
        raise PayloadTooLarge(f"{field} is {size} bytes, over {settings.max_code_bytes}", field=field)
    if "\x00" in source_code:
        raise InvalidRequest(f"{field} contains a NUL byte", field=field)


def check_config(settings: ApiSettings, init_config: dict[str, Any], field: str = "init_config") -> None:
    """Raises PayloadTooLarge when ``init_config`` is over ``max_init_config_bytes``."""
    size = json_size(init_config)
    if size > settings.max_init_config_bytes:
        raise PayloadTooLarge(f"{field} is {size} bytes, over {settings.max_init_config_bytes}", field=field)
