"""The Python SDK's `enterprise_ai.mcp`: the endpoint and headers for a key, and the
helpers over the official MCP client (against the SDK's own server on /v1/mcp, which
stands in for the gateway's door here: what is checked is what the helper sends)."""

import sys
from pathlib import Path

import enterprise_ai
import pytest

from .mcp_upstream import Upstream

# The virtualenv's editable install may point at another checkout: read this one's.
_HERE = str(Path(__file__).resolve().parents[1] / "sdk" / "python" / "enterprise_ai")
if _HERE not in enterprise_ai.__path__:
    enterprise_ai.__path__.insert(0, _HERE)

from enterprise_ai import mcp as eai_mcp  # noqa: E402

KEY = "eai_key_0123456789abcdef"


@pytest.fixture(scope="module")
def door():
    server = Upstream(path="/v1/mcp")
    yield server
    server.stop()


def test_it_names_the_endpoint_and_the_headers_for_a_key():
    assert eai_mcp.endpoint("http://127.0.0.1:8000/") == "http://127.0.0.1:8000/v1/mcp"
    assert eai_mcp.endpoint("https://gw.example/v1/mcp") == "https://gw.example/v1/mcp"
    assert eai_mcp.headers(KEY) == {"Authorization": f"Bearer {KEY}"}
    assert eai_mcp.headers(KEY, language="fr")["Accept-Language"] == "fr"
    with pytest.raises(ValueError):
        eai_mcp.headers("key\r\nX-Evil: 1")
    with pytest.raises(ValueError):
        eai_mcp.endpoint("127.0.0.1:8000")


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_it_lists_and_calls_tools_with_the_key_and_the_run(door, mode):
    names = {tool["name"] for tool in eai_mcp.list_tools(door.base_url, KEY, mode=mode)}
    assert {"lookup", "whoami"} <= names
    result = eai_mcp.call_tool(
        door.base_url,
        KEY,
        "lookup",
        {"customer_id": "C9"},
        run_id="run_1",
        step_index=2,
        mode=mode,
    )
    assert result["isError"] is False
    assert result["structuredContent"]["customer_id"] == "C9"
    call = [s for s in door.seen if s["method"] == "tools/call"][-1]
    assert call["headers"]["authorization"] == f"Bearer {KEY}"
    meta = call["body"]["params"]["_meta"]
    assert meta["eai/run_id"] == "run_1" and meta["eai/step_index"] == 2


def test_without_the_extra_it_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "mcp", None)
    with pytest.raises(eai_mcp.MCPUnavailableError, match=r"enterprise-ai\[mcp\]"):
        eai_mcp.list_tools("http://127.0.0.1:9", KEY)
    assert eai_mcp.headers(KEY)  # the plain parts need nothing
