"""The live gateway of `make sdk` (sdk/testing/gateway.py names it in EAI_SDK_TEST_CONFIG)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def gateway() -> dict[str, Any]:
    path = os.environ.get("EAI_SDK_TEST_CONFIG")
    if not path:
        if os.environ.get("EAI_SDK_REQUIRE") == "1":
            pytest.fail("EAI_SDK_TEST_CONFIG is not set: run `make sdk`")
        pytest.skip("no live gateway: run `make sdk` (EAI_SDK_TEST_CONFIG)")
    config = json.loads(Path(path).read_text())
    config["scenario_list"] = json.loads(Path(config["scenarios"]).read_text())["scenarios"]
    return config
