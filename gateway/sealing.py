"""Encryption at rest for raw values the gateway must keep for a while (a parked call's
raw input): Fernet (AES-128-CBC + HMAC-SHA256) under a key derived from the secret key.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from functools import cache
from typing import Any

from cryptography.fernet import Fernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings

from eai.jsoncodec import canonical_json


@cache
def _key(purpose: str) -> bytes:
    return HKDF(
        algorithm=hashes.SHA256(), length=32, salt=None, info=f"eai:{purpose}".encode()
    ).derive(settings.SECRET_KEY.encode())


@cache
def _fernet(purpose: str) -> Fernet:
    return Fernet(base64.urlsafe_b64encode(_key(purpose)))


def keyed_digest(value: Any) -> str:
    """HMAC-SHA256 of `value`'s canonical JSON under a key derived from the secret key.

    For digests shown beside a masked value (a decision's `input_digest`): a plain
    SHA-256 of the raw input let anyone who read both try the few masked digits (a
    phone keeps 8 of its 10 visible, a card 8 of 16) until the digest matched. The same
    input still gives the same digest within a deployment, which is what binds an
    approval to the exact call."""
    mac = hmac.new(_key("input-digest"), canonical_json(value), hashlib.sha256)
    return "hmac-sha256:" + mac.hexdigest()


def seal(value: Any, *, purpose: str = "sealed-input") -> bytes:
    return _fernet(purpose).encrypt(json.dumps(value, separators=(",", ":")).encode())


def unseal(token: bytes, *, purpose: str = "sealed-input") -> Any:
    return json.loads(_fernet(purpose).decrypt(bytes(token)))
