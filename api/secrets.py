"""Encryption of stored secrets (model API keys for rollout evaluations).

Fernet (AES-128-CBC + HMAC-SHA256, from ``cryptography``) with a key from
``SANDPIT_SECRETS_KEY`` (any string; stretched with HKDF-SHA256) or, by default, a random
key in ``<data_dir>/secrets.key`` (created with mode 0600 on first use). Losing or
changing the key makes stored model API keys unreadable: :class:`SecretUnavailable`.
"""

from __future__ import annotations

import base64
import os
import secrets
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from .settings import ApiSettings


class SecretUnavailable(RuntimeError):
    """A stored secret cannot be decrypted (the secrets key changed or was lost)."""


def _derive(material: bytes) -> bytes:
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=b"sandpit-secrets-v1", info=b"model-api-keys").derive(material)
    return base64.urlsafe_b64encode(key)


def _key_file(path: Path) -> bytes:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_bytes().strip()
    with os.fdopen(fd, "wb") as out:
        material = secrets.token_urlsafe(48).encode()
        out.write(material)
    return material


class SecretBox:
    """Encrypt/decrypt short secrets for storage in the database."""

    def __init__(self, settings: ApiSettings) -> None:
        if settings.secrets_key is not None:
            material = settings.secrets_key.get_secret_value().encode()
        else:
            material = _key_file(settings.data_dir / "secrets.key")
        self._fernet = Fernet(_derive(material))

    def encrypt(self, secret: str) -> bytes:
        """Ciphertext of ``secret`` (bytes, for a LargeBinary column)."""
        return self._fernet.encrypt(secret.encode("utf-8"))

    def decrypt(self, token: bytes) -> str:
        """The secret. Raises SecretUnavailable when the key does not match."""
        try:
            return self._fernet.decrypt(token).decode("utf-8")
        except InvalidToken:
            raise SecretUnavailable("a stored secret cannot be decrypted: the secrets key changed "
                                    "(SANDPIT_SECRETS_KEY or <data_dir>/secrets.key)") from None
