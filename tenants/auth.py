"""API-key authentication and scope checks for DRF.

The tenant comes from the key and nowhere else: views read `request.auth.tenant`.
"""

from __future__ import annotations

from typing import Any

from rest_framework.authentication import BaseAuthentication
from rest_framework.permissions import BasePermission

from eai.errors import ApiError
from tenants.models import ApiKey


class ApiPrincipal:
    """`request.user` for API-key requests: the agent (or staff user) behind the key."""

    is_authenticated = True
    is_anonymous = False

    def __init__(self, key: ApiKey) -> None:
        self.key = key

    def __str__(self) -> str:
        return self.key.agent or self.key.public_id


class ApiKeyAuthentication(BaseAuthentication):
    """`Authorization: Bearer eai_<id>_<secret>`; every bad form is 401 `unauthenticated`."""

    def authenticate(self, request: Any) -> tuple[ApiPrincipal, ApiKey] | None:
        header = request.META.get("HTTP_AUTHORIZATION", "")
        if not header:
            return None  # DRF answers NotAuthenticated -> 401 unauthenticated
        scheme, _, raw = header.partition(" ")
        if scheme.lower() != "bearer" or not raw.strip():
            raise ApiError("unauthenticated")
        key = ApiKey.objects.for_raw_key(raw.strip())
        if key is None:
            raise ApiError("unauthenticated")
        return ApiPrincipal(key), key

    def authenticate_header(self, request: Any) -> str:
        return 'Bearer realm="eai"'


class HasScope(BasePermission):
    """Requires an authenticated key holding `view.required_scopes[method]`.

    A view declares `required_scopes = {"GET": "tools:read"}`; a method without an
    entry needs only a valid key. A missing scope is 403 `insufficient_scope`.
    """

    def has_permission(self, request: Any, view: Any) -> bool:
        key = request.auth
        if not isinstance(key, ApiKey):
            raise ApiError("unauthenticated")
        scope = getattr(view, "required_scopes", {}).get(request.method)
        if scope and not key.has_scope(scope):
            raise ApiError("insufficient_scope", scope=scope)
        return True
