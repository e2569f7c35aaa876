"""Which model endpoint a tenant's request may use, and with which key.

Shared by rollout evaluations and the simulated users of conversational episodes. Rules
(server-side request forgery and key leaks are the concern):

* ``base_url`` is the caller's, or else the tenant's default (``model_base_url``, set by
  the operator); it must be ``http(s)://host[:port][/path]`` without credentials, query or
  fragment (:func:`~sandpit.api.schemas.evaluations.check_base_url`);
* a caller-chosen ``base_url`` must be one of the operator's allowed endpoints
  (``SANDPIT_MODEL_URL_ALLOW``, prefixes) when that list is set;
* a key given with the request is stored encrypted (so a restart can go on) and used
  with that request's endpoint only; the tenant's stored key is only ever sent to the
  tenant's own stored endpoint, so a caller-chosen ``base_url`` can never collect it.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import SecretStr

from ..errors import InvalidRequest
from ..schemas.evaluations import check_base_url
from ..secrets import SecretUnavailable
from ..settings import ApiSettings
from .tenants import TenantService


def same_url(a: str, b: str) -> bool:
    """Two endpoint URLs are the same (trailing slashes ignored)."""
    return a.rstrip("/") == b.rstrip("/")


@dataclass(frozen=True)
class Endpoint:
    """A resolved endpoint: ``base_url``, the request's key encrypted (or None) and where
    the key comes from: ``request``, ``tenant`` or ``none``."""

    base_url: str
    key_enc: bytes | None
    key_source: str


def resolve(tenants: TenantService, settings: ApiSettings, tenant: str, base_url: str | None,
            api_key: SecretStr | None, field: str = "base_url") -> Endpoint:
    """The endpoint a request of ``tenant`` may use (module docstring).

    Raises InvalidRequest (``field``): no ``base_url`` given or stored, a stored one that
    is not usable, or one outside the operator's allowlist."""
    row = tenants.get_tenant(tenant)
    url = base_url or row.model_base_url
    if not url:
        raise InvalidRequest("base_url is required: give one, or have the operator set the tenant's "
                             "model_base_url", field=field)
    try:
        url = check_base_url(url)
    except ValueError as exc:
        raise InvalidRequest(f"{'base_url' if base_url else 'the tenant`s model_base_url'} is not usable: {exc}",
                             field=field) from None
    allowed = settings.model_url_allow
    if base_url and allowed and not any(same_url(url, p) or url.startswith(p.rstrip("/") + "/") for p in allowed):
        raise InvalidRequest("base_url is not one of the operator's allowed model endpoints "
                             "(SANDPIT_MODEL_URL_ALLOW)", field=field)
    key_enc = tenants.box.encrypt(api_key.get_secret_value()) if api_key is not None else None
    own = row.model_base_url is not None and same_url(url, row.model_base_url)
    source = "request" if api_key is not None else "tenant" if row.model_api_key_enc and own else "none"
    return Endpoint(url, key_enc, source)


def endpoint_key(tenants: TenantService, tenant: str, key_source: str, key_enc: bytes | None) -> str | None:
    """The key to send: the request's (decrypted), the tenant's stored one, or None.
    Raises SecretUnavailable when a stored key cannot be decrypted."""
    if key_source == "request" and key_enc is not None:
        return tenants.box.decrypt(key_enc)
    if key_source == "tenant":
        return tenants.model_api_key(tenant)
    return None


__all__ = ["Endpoint", "SecretUnavailable", "endpoint_key", "resolve", "same_url"]
