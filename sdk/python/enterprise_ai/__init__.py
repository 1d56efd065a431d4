"""Python SDK for the EAI Tool Gateway (``/v1`` API).

Standard library only. Quick start::

    from enterprise_ai import EnterpriseAI

    client = EnterpriseAI(base_url="http://127.0.0.1:8000", api_key="eai_xxx_yyy")
    inv = client.tools.invoke("jira.search", {"q": "INC-42"}, run_id="run_01")
"""

from ._client import EnterpriseAI
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

__all__ = [
    "APIConnectionError",
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
]
