"""Python SDK for the EAI Tool Gateway (``/v1`` API).

Standard library only. Quick start::

    from enterprise_ai import EnterpriseAI

    client = EnterpriseAI(base_url="http://127.0.0.1:8000", api_key="eai_xxx_yyy")
    inv = client.tools.invoke("jira.search", {"q": "INC-42"}, run_id="run_01")
"""

from ._client import EnterpriseAI, new_idempotency_key
from ._errors import (
    APIConnectionError,
    AuthenticationError,
    ConflictError,
    EnterpriseAIError,
    NotFoundError,
    PermissionDeniedError,
    RateLimitError,
    ToolError,
    UnavailableError,
    ValidationError,
)
from ._version import __version__


def __getattr__(name: str):
    # AsyncEnterpriseAI needs httpx (the [async] extra): imported only when asked for.
    if name == "AsyncEnterpriseAI":
        from ._async import AsyncEnterpriseAI

        return AsyncEnterpriseAI
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "APIConnectionError",
    "AsyncEnterpriseAI",
    "AuthenticationError",
    "ConflictError",
    "EnterpriseAI",
    "EnterpriseAIError",
    "NotFoundError",
    "PermissionDeniedError",
    "RateLimitError",
    "ToolError",
    "UnavailableError",
    "ValidationError",
    "__version__",
    "new_idempotency_key",
]
