"""Encryption at rest for raw values the gateway must keep for a while (a parked call's
raw input): Fernet (AES-128-CBC + HMAC-SHA256) under a key derived from the secret key.
"""

from __future__ import annotations

import base64
import json
from functools import cache
from typing import Any

from cryptography.fernet import Fernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings


@cache
def _fernet(purpose: str) -> Fernet:
    key = HKDF(
        algorithm=hashes.SHA256(), length=32, salt=None, info=f"eai:{purpose}".encode()
    ).derive(settings.SECRET_KEY.encode())
    return Fernet(base64.urlsafe_b64encode(key))


def seal(value: Any, *, purpose: str = "sealed-input") -> bytes:
    return _fernet(purpose).encrypt(json.dumps(value, separators=(",", ":")).encode())


def unseal(token: bytes, *, purpose: str = "sealed-input") -> Any:
    return json.loads(_fernet(purpose).decrypt(bytes(token)))
