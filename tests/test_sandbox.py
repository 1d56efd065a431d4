"""Sandboxed tools (SPEC §11), with real bubblewrap: a platform admin applies a sandbox
tool, an agent calls it through the whole pipeline, and every hostile program ends
cleanly with nothing of the gateway exposed. Alice's tenant runs them; Bob's must see
nothing of hers."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest
from django.conf import settings
from django.test import override_settings

from gateway import credentials, sandbox
from gateway.manifests import ManifestInvalid, apply_manifests
from tests.conftest import error_of, tool_manifest

pytestmark = pytest.mark.skipif(
    not shutil.which("bwrap") and os.environ.get("EAI_REQUIRE_DEPLOY_TOOLS") != "1",
    reason="bubblewrap is not installed (apt-get install bubblewrap)",
)

PY = "/usr/bin/python3"


def script_tool(name: str, code: str, *, profile: str = "strict", timeout_ms: int = 10000, **spec):
    """A sandbox tool running `code` with python3: `data` is its parsed stdin."""
    prelude = "import json, os, sys\ndata = json.load(sys.stdin)\n"
    return tool_manifest(
        name,
        {"type": "sandbox", "command": [PY, "-c", prelude + code], "timeout_ms": timeout_ms},
        sandbox_profile=profile,
        **spec,
    )


def apply(tenant, *manifests):
    apply_manifests(tenant=tenant, documents=list(manifests))


def run(api, tool, payload=None):
    response = api.invoke(tool, payload or {})
    return response.status_code, response.json()


def test_it_runs_a_tool_through_the_pipeline_and_masks_its_output(alice, bob, tenant_a):
    apply(
        tenant_a,
        script_tool(
            "report.render",
            "print(json.dumps({'rows': len(data['rows']), 'iban': 'FR7630006000011234567890189'}))",
        ),
    )
    status, body = run(alice, "report.render", {"rows": [1, 2, 3]})
    assert status == 200, body
    assert body["output"]["rows"] == 3
    assert body["output"]["iban"] == "FR76*******************0189"
    assert body["redactions"] == [{"entity": "IBAN", "count": 1, "where": "output"}]
    tool = alice.get("/v1/tools/report.render").json()
    assert tool["sandbox_profile"] == "strict" and tool["endpoint"]["type"] == "sandbox"
    assert tool["network"] == "none"
    assert error_of(bob.invoke("report.render", {}))["code"] == "tool_not_found"


def test_apply_refuses_no_profile_an_unknown_one_and_one_beyond_the_platform(alice):
    none = script_tool("x.none", "print('{}')", profile="none")
    response = alice.post("/v1/manifests/apply", none)
    assert response.status_code == 422
    assert error_of(response)["details"]["errors"][0]["path"] == "/spec/sandbox_profile"
    unknown = script_tool("x.unknown", "print('{}')", profile="nosuch")
    response = alice.post("/v1/manifests/apply", unknown)
    assert response.status_code == 422
    assert error_of(response)["details"]["errors"][0]["path"] == "/spec/sandbox_profile"
    greedy = {
        "apiVersion": "eai/v1",
        "kind": "SandboxProfile",
        "metadata": {"name": "greedy", "version": "1"},
        "spec": {"memory_mb": 65536, "mounts": [{"source": "/etc", "target": "/host-etc"}]},
    }
    response = alice.post("/v1/manifests/apply", greedy)
    assert response.status_code == 422
    paths = {e["path"] for e in error_of(response)["details"]["errors"]}
    assert paths == {"/spec/memory_mb", "/spec/mounts/0/source"}
    french = alice.post("/v1/manifests/apply", greedy, headers={"Accept-Language": "fr"})
    assert "manifeste" in error_of(french)["message"]


def test_a_tenant_profile_mounts_only_what_the_platform_allows(alice, tenant_a):
    # A platform directory of tools: readable by the sandbox's own unprivileged uid.
    tmp_path = Path(tempfile.mkdtemp(prefix="eai-sandbox-roots-"))
    tmp_path.chmod(0o755)
    tools = tmp_path / "tools"
    tools.mkdir(mode=0o755)
    (tools / "count.py").write_text(
        "import json, sys\n"
        "print(json.dumps({'words': len(json.load(sys.stdin)['text'].split())}))\n"
    )
    with override_settings(EAI_SANDBOX_ROOTS=[str(tmp_path)]):
        profile = {
            "apiVersion": "eai/v1",
            "kind": "SandboxProfile",
            "metadata": {"name": "words", "version": "1"},
            "spec": {"memory_mb": 128, "mounts": [{"source": str(tools), "target": "/tool"}]},
        }
        tool = tool_manifest(
            "text.count",
            {"type": "sandbox", "command": [PY, "/tool/count.py"]},
            sandbox_profile="words",
        )
        response = alice.post("/v1/manifests/apply", {"manifests": [profile, tool]})
        assert response.status_code == 200, response.json()
        status, body = run(alice, "text.count", {"text": "un deux trois"})
    shutil.rmtree(tmp_path)
    assert status == 200, body
    assert body["output"] == {"words": 3}


def test_it_sees_nothing_of_the_gateway(alice, tenant_a):
    checkout = str(settings.BASE_DIR)
    apply(
        tenant_a,
        script_tool(
            "spy.files",
            "out = {}\n"
            "for p in data['paths']:\n"
            "    try:\n"
            "        open(p, 'rb').read(1); out[p] = 'read'\n"
            "    except Exception as e:\n"
            "        out[p] = type(e).__name__\n"
            "out['env'] = sorted(os.environ)\n"
            "out['root'] = sorted(os.listdir('/'))\n"
            "print(json.dumps(out))",
        ),
    )
    paths = [
        f"{checkout}/manage.py",
        f"{checkout}/.eai-secret-key",
        f"{checkout}/db.sqlite3",
        "/etc/shadow",
        "/etc/passwd",
        "/root/.bashrc",
        f"/proc/{os.getpid()}/environ",
    ]
    status, body = run(alice, "spy.files", {"paths": paths})
    assert status == 200, body
    out = body["output"]
    for path in paths:
        assert out[path] != "read", path
    assert out["env"] == ["HOME", "LANG", "PATH", "TMPDIR"]
    assert not {"root", "home", "work", "var", "srv"} & set(out["root"])


def test_it_has_no_network_under_strict_and_the_hosts_under_egress(alice, tenant_a):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    code = (
        "import socket\n"
        "try:\n"
        "    socket.create_connection(('127.0.0.1', data['port']), timeout=2).close()\n"
        "    r = 'connected'\n"
        "except OSError as e:\n"
        "    r = type(e).__name__\n"
        "print(json.dumps({'net': r}))"
    )
    apply(
        tenant_a, script_tool("net.strict", code), script_tool("net.egress", code, profile="egress")
    )
    try:
        status, body = run(alice, "net.strict", {"port": port})
        assert status == 200, body
        assert body["output"]["net"] != "connected"
        status, body = run(alice, "net.egress", {"port": port})
        assert body["output"] == {"net": "connected"}, body
        assert alice.get("/v1/tools/net.egress").json()["network"] == "external"
    finally:
        listener.close()


def test_it_writes_only_its_own_tmp_which_no_other_call_sees(alice, bob, tenant_a, tenant_b):
    code = (
        "out = {'seen': sorted(os.listdir('/tmp'))}\n"
        "for p in ['/usr/x', '/etc/x', '/x', '/tmp/mine']:\n"
        "    try:\n"
        "        open(p, 'w').write('x'); out[p] = 'written'\n"
        "    except OSError as e:\n"
        "        out[p] = type(e).__name__\n"
        "print(json.dumps(out))"
    )
    apply(tenant_a, script_tool("fs.write", code))
    apply(tenant_b, script_tool("fs.write", code))
    first = run(alice, "fs.write")[1]["output"]
    assert first["/tmp/mine"] == "written"
    assert {first[p] for p in ("/usr/x", "/etc/x", "/x")} <= {
        "OSError",
        "PermissionError",
        "FileNotFoundError",
        "IsADirectoryError",
    }
    assert "written" not in {first[p] for p in ("/usr/x", "/etc/x", "/x")}
    assert first["seen"] == []
    assert run(alice, "fs.write")[1]["output"]["seen"] == []
    assert run(bob, "fs.write")[1]["output"]["seen"] == []


def test_it_cannot_signal_the_gateway(alice, tenant_a):
    apply(
        tenant_a,
        script_tool(
            "pid.kill",
            "import signal\n"
            "try:\n"
            "    os.kill(data['pid'], signal.SIGTERM); r = 'sent'\n"
            "except OSError as e:\n"
            "    r = type(e).__name__\n"
            "print(json.dumps({'kill': r, 'mypid': os.getpid()}))",
        ),
    )
    status, body = run(alice, "pid.kill", {"pid": os.getpid()})
    assert status == 200
    assert body["output"]["kill"] != "sent"
    assert body["output"]["mypid"] < 10  # its own PID namespace


def _alive(marker: str) -> list[str]:
    found = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True)
    return found.stdout.split()


def test_the_whole_tree_dies_at_the_timeout_double_forked_children_included(alice, tenant_a):
    marker = f"eai-orphan-{uuid.uuid4().hex}"
    apply(
        tenant_a,
        script_tool(
            "tree.sleep",
            "import subprocess, time\n"
            f"subprocess.Popen(['/bin/sh', '-c', '(sleep 300 & ) ; sleep 300', '{marker}'],"
            " start_new_session=True)\n"
            "time.sleep(300)",
            timeout_ms=1500,
        ),
    )
    status, body = run(alice, "tree.sleep")
    assert status == 504, body
    assert body["error"]["code"] == "tool_timeout"
    deadline = time.monotonic() + 10
    while _alive(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _alive(marker) == []


@pytest.mark.parametrize(
    ("name", "code", "statuses"),
    [
        ("bomb.fork", "while True:\n    os.fork()", {502, 504}),
        ("bomb.memory", "x = []\nwhile True:\n    x.append(bytearray(16 * 1024 * 1024))", {502}),
        ("bomb.output", "while True:\n    sys.stdout.write('x' * 65536)", {502}),
        ("bomb.cpu", "while True:\n    pass", {502, 504}),
        ("bad.json", "print('not json')", {502}),
        ("bad.exit", "sys.stderr.write('FR7630006000011234567890189 broke'); sys.exit(3)", {502}),
    ],
)
def test_hostile_programs_end_cleanly(alice, bob, tenant_a, tenant_b, name, code, statuses):
    apply(tenant_a, script_tool(name, code, timeout_ms=8000))
    apply(tenant_b, script_tool("calm", "print(json.dumps({'ok': True}))"))
    status, body = run(alice, name)
    assert status in statuses, body
    assert body["error"]["code"] in {"tool_error", "tool_timeout", "invalid_output"}
    assert "FR7630006000011234567890189" not in json.dumps(body)
    detail = alice.get(f"/v1/tools/invocations/{body['error']['invocation_id']}").json()
    assert "FR7630006000011234567890189" not in json.dumps(detail)
    # Nothing is left running, and the other tenant is served.
    assert run(bob, "calm")[1]["output"] == {"ok": True}


def test_the_lease_reaches_the_tool_as_its_variable_and_is_masked_in_what_it_prints(
    alice, tenant_a
):
    credentials.set_secret(tenant=tenant_a, name="report-bot", secret="s3cr3t-Lease-Value-42")
    apply(
        tenant_a,
        script_tool(
            "lease.echo",
            "v = os.environ.get('REPORT_TOKEN')\n"
            "sys.stderr.write(v or '-')\n"
            "print(json.dumps({'got': v, 'len': len(v or '')}))",
            credential_ref="report-bot",
            credential_injection={"env": "REPORT_TOKEN"},
        ),
    )
    status, body = run(alice, "lease.echo")
    assert status == 200, body
    assert body["output"]["len"] == len("s3cr3t-Lease-Value-42")
    assert "s3cr3t-Lease-Value-42" not in json.dumps(body)
    assert body["output"]["got"] == "[SECRET]"


def test_without_a_runtime_it_answers_503_and_readyz_says_why(alice, tenant_a):
    apply(tenant_a, script_tool("off.tool", "print('{}')"))
    with override_settings(EAI_SANDBOX_RUNTIME="off"):
        response = alice.invoke("off.tool", {})
        assert response.status_code == 503
        assert error_of(response)["code"] == "tool_unavailable"
        ready = alice.get("/readyz")
        assert ready.status_code == 200
        assert ready.json()["checks"]["sandbox"].startswith("off")
        # The catalog says so too (SPEC §5: its real availability).
        assert alice.get("/v1/tools/off.tool").json()["availability"]["status"] == "unavailable"
    assert alice.get("/v1/tools/off.tool").json()["availability"]["status"] == "available"


@pytest.mark.django_db(transaction=True)
def test_one_tenant_cannot_take_every_sandbox(make_api, tenant_a, tenant_b):
    alice, bob = make_api(tenant_a), make_api(tenant_b)
    slow = script_tool("slow", "import time\ntime.sleep(3)\nprint('{}')")
    apply(tenant_a, slow)
    apply(tenant_b, script_tool("quick", "print(json.dumps({'ok': 1}))"))
    answers: list[int] = []
    with override_settings(EAI_SANDBOX_SLOTS=2, EAI_SANDBOX_TENANT_SLOTS=1):
        first = threading.Thread(
            target=lambda: answers.append(alice.invoke("slow", {}).status_code)
        )
        first.start()
        time.sleep(1.0)
        started = time.monotonic()
        second = alice.invoke("slow", {})
        waited = time.monotonic() - started
        assert second.status_code == 503, second.json()
        assert waited < 2.5  # answered after a short wait, not after the first call
        assert bob.invoke("quick", {}).json()["output"] == {"ok": 1}
        first.join()
    assert answers == [200]


def test_the_profile_limits_are_what_the_sandbox_gets():
    # The credential never travels in an argv (readable by any local user).
    assert "TOKEN" not in " ".join(sandbox._bwrap_argv(sandbox.BUILTIN["strict"], ["/bin/true"]))
    assert sandbox.tool_environment({"TOKEN": "s3cret"})["TOKEN"] == "s3cret"
    argv = sandbox._limits_argv(sandbox.BUILTIN["strict"], 2_000_001)
    assert argv[0].endswith("setpriv") and argv[1] == "--reuid=2000001"
    assert "--as=268435456" in argv and "--nproc=64" in argv
    bwrap = sandbox._bwrap_argv(sandbox.BUILTIN["strict"], ["/bin/true"])
    assert "--unshare-all" in bwrap and "--share-net" not in bwrap
    assert "--cap-drop" in bwrap and "--die-with-parent" in bwrap
    assert "/etc/shadow" not in bwrap and "/home" not in bwrap and "/root" not in bwrap
    assert "--share-net" in sandbox._bwrap_argv(sandbox.BUILTIN["egress"], ["/bin/true"])
    assert Path("/usr/bin/python3").exists()


# --- Hostile review (issue 19): each test below is an attack that once worked. ---


def test_it_cannot_write_dev_or_fill_the_hosts_memory_through_it(alice, tenant_a):
    # bwrap's --dev is a tmpfs of its own with no size bound: writable, it would be a
    # second /tmp without the profile's tmp_mb (host memory).
    code = (
        "out = {}\n"
        "for p in ['/dev/x', '/dev/shm/x', '/dev/mqueue/x', '/proc/x', '/sys/x', '/x']:\n"
        "    try:\n"
        "        open(p, 'wb').write(b'x' * 1024); out[p] = 'written'\n"
        "    except OSError as e:\n"
        "        out[p] = type(e).__name__\n"
        "out['null'] = open('/dev/null', 'wb').write(b'x')\n"
        "print(json.dumps(out))"
    )
    apply(tenant_a, script_tool("dev.write", code))
    status, body = run(alice, "dev.write")
    assert status == 200, body
    out = body["output"]
    assert out.pop("null") == 1  # /dev/null still works
    assert "written" not in out.values(), out


@pytest.mark.parametrize(
    "code",
    [
        "print('[' * 200000 + ']' * 200000)",  # a RecursionError in json.loads
        "print('{\"a\": NaN}')",
        'print(\'{"a": "x\\\\u0000y"}\')',  # jsonb cannot store it
        'print(\'{"a": "\\\\ud800"}\')',  # a lone surrogate: no UTF-8 for it
    ],
)
def test_it_holds_a_tools_output_to_what_an_upstream_answer_must_be(
    alice, bob, tenant_a, tenant_b, code
):
    apply(tenant_a, script_tool("odd.json", code))
    status, body = run(alice, "odd.json")
    assert status == 502, body
    assert body["error"]["code"] == "invalid_output"
    assert error_of(bob.invoke("odd.json", {}))["code"] == "tool_not_found"


def _proc(pid: str, name: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/{name}").read_bytes()
    except OSError:  # it ended meanwhile
        return b""


def test_the_lease_is_in_no_host_processs_environment_or_argv():
    # Root (or the gateway's uid) reads /proc/<pid>/environ of bwrap on the host; and a
    # variable handed to setpriv, prlimit and bwrap themselves (LD_PRELOAD, LD_AUDIT…
    # named by `credential_injection.env`) would steer them, as root, on the host.
    secret = f"lease-{uuid.uuid4().hex}"
    marker = f"eai-env-{uuid.uuid4().hex}"
    endpoint = {"type": "sandbox", "command": [PY, "-c", "import time; time.sleep(4)", marker]}
    args = {"profile": sandbox.BUILTIN["strict"], "tenant": "t-env", "env": {"TOKEN": secret}}
    thread = threading.Thread(
        target=lambda: pytest.raises(sandbox.SandboxError, sandbox.run, endpoint, {}, **args)
    )
    thread.start()
    seen: dict[str, tuple[bytes, bytes]] = {}
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        for pid in _alive(marker):
            seen[pid] = (_proc(pid, "cmdline"), _proc(pid, "environ"))
        time.sleep(0.1)
    thread.join()
    hosts = [v for v in seen.values() if b"bwrap\0" in v[0]]
    assert hosts, seen  # the check saw bwrap itself
    tool = [v for v in seen.values() if b"bwrap\0" not in v[0]]
    assert any(secret.encode() in environ for _cmd, environ in tool)  # the tool has it
    for cmdline, environ in hosts:
        assert secret.encode() not in environ and secret.encode() not in cmdline
        assert b"TOKEN=" not in environ


@pytest.mark.parametrize(
    "leak",
    [
        "v + 'x' * 490",  # the diagnostic's 500-character cut falls inside the secret
        "'y' * 70000 + v + 'x' * 490",  # past the bound on standard error kept
        "'x' * 70000 + v",
        "base64.b64encode(v.encode()).decode()",
        "base64.urlsafe_b64encode(('~~' + v).encode()).decode()",
    ],
)
def test_a_lease_printed_on_stderr_leaks_no_piece_of_itself(alice, tenant_a, leak):
    secret = "s3cr3t-Lease-Value-42~?>"
    credentials.set_secret(tenant=tenant_a, name="report-bot", secret=secret)
    apply(
        tenant_a,
        script_tool(
            "lease.stderr",
            f"import base64\nv = os.environ['REPORT_TOKEN']\nsys.stderr.write({leak})\nsys.exit(1)",
            credential_ref="report-bot",
            credential_injection={"env": "REPORT_TOKEN"},
        ),
    )
    status, body = run(alice, "lease.stderr")
    assert status == 502, body
    text = json.dumps(body)
    encodings = [secret, base64.b64encode(secret.encode()).decode()]
    for encoded in encodings:
        for start in range(len(encoded) - 8):
            assert encoded[start : start + 8] not in text, (encoded[start : start + 8], text)


def test_a_failing_tools_exception_carries_no_lease_for_a_log_to_print():
    secret = f"lease-{uuid.uuid4().hex}"
    endpoint = {
        "type": "sandbox",
        "command": [PY, "-c", "import os, sys; sys.exit(os.environ['TOKEN'] + ' broke')"],
    }
    with pytest.raises(sandbox.SandboxError) as caught:
        sandbox.run(
            endpoint, {}, profile=sandbox.BUILTIN["strict"], tenant="t-log", env={"TOKEN": secret}
        )
    assert "broke" in str(caught.value)
    assert secret not in str(caught.value) and secret not in repr(caught.value.reason.params)


def test_a_daemon_left_by_a_successful_run_dies_with_it(alice, bob, tenant_a, tenant_b):
    marker = f"eai-daemon-{uuid.uuid4().hex}"
    apply(
        tenant_a,
        script_tool(
            "tree.daemon",
            # A double-forked, setsid'd daemon that closes stdout (no pipe keeps the call
            # waiting), and one that keeps it open after its parent has exited.
            "import subprocess\n"
            f"subprocess.Popen(['/bin/sh', '-c', '(sleep 300 &) ; exit 0', '{marker}'],"
            " start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
            f"subprocess.Popen(['/bin/sleep', '300', '{marker}'], start_new_session=True)\n"
            "print(json.dumps({'ok': True}))",
        ),
    )
    apply(tenant_b, script_tool("calm", "print(json.dumps({'ok': True}))"))
    started = time.process_time()
    status, body = run(alice, "tree.daemon")
    assert status == 200, body
    assert body["output"] == {"ok": True}
    assert time.process_time() - started < 5  # no busy wait on a pipe held open
    deadline = time.monotonic() + 10
    while _alive(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _alive(marker) == []
    assert run(bob, "calm")[1]["output"] == {"ok": True}


def test_a_thread_bomb_ends_cleanly(alice, bob, tenant_a, tenant_b):
    apply(
        tenant_a,
        script_tool(
            "bomb.threads",
            "import threading, time\n"
            "n = 0\n"
            "while True:\n"
            "    threading.Thread(target=time.sleep, args=(60,), daemon=True).start(); n += 1",
            timeout_ms=8000,
        ),
    )
    apply(tenant_b, script_tool("calm", "print(json.dumps({'ok': True}))"))
    status, body = run(alice, "bomb.threads")
    assert status == 502, body
    assert run(bob, "calm")[1]["output"] == {"ok": True}


def test_strict_reaches_no_abstract_unix_socket_and_sees_no_host_process(alice, tenant_a):
    name = f"eai-abstract-{uuid.uuid4().hex}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind("\0" + name)
    listener.listen(1)
    code = (
        "import socket\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        "try:\n"
        "    s.connect('\\0' + data['name']); r = 'connected'\n"
        "except OSError as e:\n"
        "    r = type(e).__name__\n"
        "try:\n"
        "    socket.getaddrinfo('localhost', 80); dns = 'resolved'\n"
        "except OSError as e:\n"
        "    dns = type(e).__name__\n"
        "pids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\n"
        "print(json.dumps({'unix': r, 'pids': pids, 'sys': os.path.exists('/sys/kernel'),"
        " 'dns': dns, 'ifaces': [n for _, n in socket.if_nameindex()]}))"
    )
    apply(tenant_a, script_tool("net.unix", code))
    try:
        status, body = run(alice, "net.unix", {"name": name})
    finally:
        listener.close()
    assert status == 200, body
    out = body["output"]
    assert out["unix"] != "connected"
    assert max(out["pids"]) < 10 and not out["sys"]
    assert out["ifaces"] == ["lo"]  # its own loopback, nothing of the host's


@pytest.mark.parametrize(
    ("command", "path"),
    [
        (["/bin/true"] * 300, "/spec/endpoint"),
        (["x" * 1001], "/spec/endpoint"),
        ([], "/spec/endpoint"),
    ],
)
def test_apply_refuses_a_command_no_sandbox_could_run(alice, command, path):
    manifest = tool_manifest(
        "bad.command", {"type": "sandbox", "command": command}, sandbox_profile="strict"
    )
    response = alice.post("/v1/manifests/apply", manifest)
    assert response.status_code == 422, response.json()
    assert error_of(response)["details"]["errors"][0]["path"].startswith(path)


def test_a_nul_in_a_command_is_refused_over_the_api_and_from_a_file(alice, tenant_a):
    manifest = tool_manifest(
        "nul.command",
        {"type": "sandbox", "command": ["/usr/bin/py\u0000thon3"]},
        sandbox_profile="strict",
    )
    assert alice.post("/v1/manifests/apply", manifest).status_code == 400
    with pytest.raises(ManifestInvalid):
        apply(tenant_a, manifest)


@pytest.mark.parametrize("command", ["/nonexistent/tool", "no-such-tool-anywhere", "/tmp"])
def test_a_command_that_does_not_run_is_a_clean_502(alice, bob, tenant_a, tenant_b, command):
    apply(
        tenant_a,
        tool_manifest("gone", {"type": "sandbox", "command": [command]}, sandbox_profile="strict"),
    )
    status, body = run(alice, "gone")
    assert status == 502, body
    assert body["error"]["code"] == "tool_error"
    assert error_of(bob.invoke("gone", {}))["code"] == "tool_not_found"


def test_a_tool_cannot_name_another_tenants_profile(alice, bob, tenant_a, tenant_b):
    profile = {
        "apiVersion": "eai/v1",
        "kind": "SandboxProfile",
        "metadata": {"name": "bobs", "version": "1"},
        "spec": {"memory_mb": 128},
    }
    assert bob.post("/v1/manifests/apply", profile).status_code == 200
    tool = script_tool("uses.bobs", "print('{}')", profile="bobs")
    response = alice.post("/v1/manifests/apply", tool)
    assert response.status_code == 422
    assert error_of(response)["details"]["errors"][0]["path"] == "/spec/sandbox_profile"
    for name in ("strict", "egress", "none"):
        shadow = {**profile, "metadata": {"name": name, "version": "1"}}
        assert alice.post("/v1/manifests/apply", shadow).status_code == 422


def test_a_mount_is_checked_again_when_it_runs_symlinks_and_dotdot_included(alice, tenant_a):
    roots = Path(tempfile.mkdtemp(prefix="eai-sandbox-roots-"))
    roots.chmod(0o755)
    tools = roots / "tools"
    tools.mkdir(mode=0o755)
    (roots / "escape").symlink_to("/etc")
    checkout = str(settings.BASE_DIR)
    # No descriptor of the host's (the mount's O_PATH one, say) reaches the tool.
    code = "print(json.dumps([sorted(os.listdir('/tool')), len(os.listdir('/proc/self/fd'))]))"
    try:
        with override_settings(EAI_SANDBOX_ROOTS=[str(roots)]):
            for source in (f"{tools}/../../../etc", str(roots / "escape"), f"{roots}/../"):
                greedy = {
                    "apiVersion": "eai/v1",
                    "kind": "SandboxProfile",
                    "metadata": {"name": "greedy", "version": "1"},
                    "spec": {"mounts": [{"source": source, "target": "/tool"}]},
                }
                response = alice.post("/v1/manifests/apply", greedy)
                assert response.status_code == 422, source
            profile = {
                "apiVersion": "eai/v1",
                "kind": "SandboxProfile",
                "metadata": {"name": "tools", "version": "1"},
                "spec": {"mounts": [{"source": str(tools), "target": "/tool"}]},
            }
            apply(tenant_a, profile, script_tool("ls.tool", code, profile="tools"))
            assert run(alice, "ls.tool")[1]["output"] == [[], 4]  # 0-2 and listdir's own
            # Once applied, the directory becomes a symlink to the gateway's checkout.
            tools.rmdir()
            tools.symlink_to(checkout)
            status, body = run(alice, "ls.tool")
            assert status in (502, 503), body
            assert "manage.py" not in json.dumps(body)
        # The platform no longer allows that root: the profile mounts nothing.
        tools.unlink()
        tools.mkdir(mode=0o755)
        with override_settings(EAI_SANDBOX_ROOTS=[]):
            status, body = run(alice, "ls.tool")
            assert status in (502, 503), body
    finally:
        shutil.rmtree(roots)


def test_its_errors_are_said_in_french_too(alice, bob, tenant_a, tenant_b):
    apply(tenant_a, script_tool("fails", "sys.stderr.write('boom'); sys.exit(3)"))
    apply(tenant_a, script_tool("talks", "print('not json')"))
    failed = run(alice, "fails")[1]["error"]["message_i18n"]
    assert "boom" in failed["fr"] and "statut 3" in failed["fr"], failed
    talked = run(alice, "talks")[1]["error"]["message_i18n"]
    assert talked["fr"] != talked["en"] and "JSON" in talked["fr"], talked
    with override_settings(EAI_SANDBOX_RUNTIME="off"):
        off = error_of(alice.invoke("fails", {}))["message_i18n"]
    assert "bac à sable" in off["fr"], off
    assert error_of(bob.invoke("fails", {}))["code"] == "tool_not_found"


def _uid_of_a_sandbox(tenant: str) -> int:
    endpoint = {
        "type": "sandbox",
        "command": [PY, "-c", "import os, time; time.sleep(2); print(os.getuid())"],
    }
    return int(sandbox.run(endpoint, {}, profile=sandbox.BUILTIN["strict"], tenant=tenant, env={}))


@pytest.mark.skipif(os.geteuid() != 0, reason="sandboxes get uids of their own under root")
def test_two_gateway_processes_never_run_sandboxes_as_the_same_uid():
    # API and worker processes each have their own slots: sharing a uid, one's fork bomb
    # would spend the other's RLIMIT_NPROC.
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the other process
        try:
            os.write(write, str(_uid_of_a_sandbox("t-other")).encode())
        finally:
            os._exit(0)
    os.close(write)
    mine = _uid_of_a_sandbox("t-mine")
    os.waitpid(child, 0)
    theirs = int(os.read(read, 64))
    os.close(read)
    assert mine >= sandbox.UID_BASE and theirs >= sandbox.UID_BASE
    assert mine != theirs


def test_the_slot_pool_never_hands_a_slot_out_twice_and_leaks_none():
    pool = sandbox._Slots()
    held: list[int] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def worker(tenant: str) -> None:
        for attempt in range(30):
            try:
                with pool.take(tenant) as slot:
                    with lock:
                        assert slot not in held, (slot, held)
                        held.append(slot)
                    time.sleep(0.001)
                    with lock:
                        held.remove(slot)
                    if attempt % 3 == 0:
                        raise RuntimeError("the call failed")  # must free the slot
            except RuntimeError:
                pass
            except sandbox.SandboxError:
                pass  # busy: waited its 0.25 s
            except AssertionError as exc:
                errors.append(exc)

    with override_settings(EAI_SANDBOX_SLOTS=4, EAI_SANDBOX_TENANT_SLOTS=4):
        # The platform grows the pool while a slot is held: not handed out again.
        with (
            pool.take("t-first") as first,
            override_settings(EAI_SANDBOX_SLOTS=6, EAI_SANDBOX_TENANT_SLOTS=6),
            contextlib.ExitStack() as stack,
        ):
            others = [stack.enter_context(pool.take("t-second")) for _ in range(5)]
            assert first not in others
        threads = [threading.Thread(target=worker, args=(f"t{i % 3}",)) for i in range(12)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        assert sorted(pool._free) == [0, 1, 2, 3] and sum(pool._per_tenant.values()) == 0


def test_a_tool_that_never_reads_its_input_still_times_out():
    # A payload larger than a pipe holds: writing it all before watching the clock would
    # block the gateway's thread for as long as the tool cares to sleep.
    endpoint = {
        "type": "sandbox",
        "command": [PY, "-c", "import time; time.sleep(300)"],
        "timeout_ms": 1500,
    }
    caught: list[BaseException] = []

    def call() -> None:
        try:
            sandbox.run(
                endpoint,
                {"pad": "x" * 1_000_000},
                profile=sandbox.BUILTIN["strict"],
                tenant="t-stdin",
                env={},
            )
        except sandbox.SandboxError as exc:
            caught.append(exc)

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(30)
    assert not thread.is_alive(), "the call ignored its timeout"
    assert [e.code for e in caught] == ["tool_timeout"]
    # And a tool that does read it gets all of it.
    reader = {"type": "sandbox", "command": [PY, "-c", "import sys; print(len(sys.stdin.read()))"]}
    got = sandbox.run(
        reader, {"pad": "x" * 1_000_000}, profile=sandbox.BUILTIN["strict"], tenant="t", env={}
    )
    assert int(got) == len('{"pad":""}') + 1_000_000


def test_it_cannot_make_user_namespaces_of_its_own(alice, bob, tenant_a, tenant_b):
    # A nested user namespace makes the tool "root" there: every namespaced corner of the
    # kernel (mounts, netfilter, …) opens to it, where most local privilege escalations
    # have been found.
    apply(
        tenant_a,
        script_tool(
            "userns",
            "import ctypes\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            "r = libc.unshare(0x10000000)\n"  # CLONE_NEWUSER
            "print(json.dumps({'unshare': r, 'errno': ctypes.get_errno()}))",
        ),
    )
    status, body = run(alice, "userns")
    assert status == 200, body
    assert body["output"]["unshare"] == -1, body
    assert error_of(bob.invoke("userns", {}))["code"] == "tool_not_found"


def _cgroups_here():
    found = sandbox.CGROUPS.root()
    if found is None:
        if os.environ.get("EAI_REQUIRE_DEPLOY_TOOLS") == "1" and os.geteuid() == 0:
            pytest.fail("no memory cgroup for sandboxes although CI runs as root")
        # Visible, not skipped: without a cgroup the profile's memory bounds each process.
        pytest.xfail("no cgroup this process can make: memory is bounded per process only")
    return found


def _ours(root: Path) -> list[Path]:
    return list(root.glob(f"{sandbox.CGROUP_PREFIX}{os.getpid()}-*"))


def test_memory_spread_over_processes_stays_within_the_profile(alice, tenant_a):
    """RLIMIT_AS bounds each process: four children of 64 MiB each would hold 256 MiB
    under a 96 MiB profile. The sandbox's memory cgroup bounds them together."""
    root, _version = _cgroups_here()
    profile = {
        "apiVersion": "eai/v1",
        "kind": "SandboxProfile",
        "metadata": {"name": "small", "version": "1"},
        "spec": {"memory_mb": 96, "processes": 8},
    }
    code = (
        "got, kids = 0, []\n"
        "for _ in range(4):\n"
        "    r, w = os.pipe()\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        try:\n"
        "            b = b'x' * (64 * 1024 * 1024); os.write(w, b'1')\n"  # written: resident
        "            import time; time.sleep(5)\n"
        "        finally:\n"
        "            os._exit(0)\n"
        "    os.close(w)\n"  # a child killed for its memory: the read ends empty
        "    got += len(os.read(r, 1))\n"
        "    kids.append(pid)\n"
        "alive = sum(os.waitpid(k, os.WNOHANG) == (0, 0) for k in kids)\n"
        "print(json.dumps({'allocated': got, 'mib_held_at_once': alive * 64}))"
    )
    apply(tenant_a, profile, script_tool("spread", code, profile="small"))
    status, body = run(alice, "spread")
    assert status == 200, body["error"]["message"]
    # children held their 64 MiB (the bound is no refusal of everything), never two at once
    assert body["output"]["allocated"] >= 1 and body["output"]["mib_held_at_once"] <= 96, body
    assert _ours(root) == []  # emptied and removed with the call


def test_one_process_within_the_profile_is_left_alone_by_the_cgroup(alice, tenant_a):
    root, _version = _cgroups_here()
    code = "b = b'x' * (160 * 1024 * 1024)\nprint(json.dumps({'mib': len(b) >> 20}))"
    apply(tenant_a, script_tool("big.enough", code))  # strict: 256 MiB
    status, body = run(alice, "big.enough")
    assert (status, body.get("output")) == (200, {"mib": 160}), body
    assert _ours(root) == []


def test_a_cgroup_directory_that_cannot_serve_stops_sandboxes_closed(alice, tenant_a, tmp_path):
    apply(tenant_a, script_tool("calm", "print(json.dumps({'ok': True}))"))
    with override_settings(EAI_SANDBOX_CGROUP=str(tmp_path)):  # a plain directory
        assert sandbox.runtime_state()[0] == "unavailable"
        response = alice.invoke("calm", {})
        assert response.status_code == 503
        assert error_of(response)["code"] == "tool_unavailable"
        ready = alice.get("/readyz")
        assert "EAI_SANDBOX_CGROUP" in ready.json()["checks"]["sandbox"]
    assert list(tmp_path.iterdir()) == []
    with override_settings(EAI_SANDBOX_CGROUP="off"):
        assert sandbox.CGROUPS.root() is None
        status, body = run(alice, "calm")
        assert (status, body["output"]) == (200, {"ok": True})


def test_a_fork_bombs_remains_cost_the_next_sandbox_nothing(alice, bob, tenant_a, tenant_b):
    # The bomb's thousands die after its call has answered; a next sandbox given the same
    # uid meanwhile could not even fork (its RLIMIT_NPROC counts them).
    bomb = (
        "import threading, time\n"
        "while True:\n"
        "    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()"
    )
    apply(tenant_a, script_tool("bomb", bomb, timeout_ms=3000))
    forks = (
        "pids = []\n"
        "for _ in range(4):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        os._exit(0)\n"
        "    pids.append(pid)\n"
        "[os.waitpid(p, 0) for p in pids]\n"
        "print(json.dumps({'forked': len(pids)}))"
    )
    few = {
        "apiVersion": "eai/v1",
        "kind": "SandboxProfile",
        "metadata": {"name": "few", "version": "1"},
        "spec": {"processes": 8},  # its own 2 and 4 children: any remains would count
    }
    apply(tenant_b, few, script_tool("forks", forks, profile="few"))
    for _ in range(3):
        assert run(alice, "bomb")[0] in (502, 504)
        status, body = run(bob, "forks")
        assert status == 200, body["error"]["message"]
        assert body["output"] == {"forked": 4}


def test_a_tenant_profile_decides_its_tools_network_in_the_catalog(alice, bob, tenant_a):
    # Policies read `network`: a tool claiming `none` (or the default `internal`) under a
    # profile on the host's network would pass a rule refusing external tools.
    profile = {
        "apiVersion": "eai/v1",
        "kind": "SandboxProfile",
        "metadata": {"name": "outbound", "version": "1"},
        "spec": {"network": "host"},
    }
    quiet = {**profile, "metadata": {"name": "quiet", "version": "1"}, "spec": {}}
    apply(tenant_a, profile)
    apply(
        tenant_a,
        quiet,
        script_tool("out.tool", "print('{}')", profile="outbound", network="none"),
        script_tool("quiet.tool", "print('{}')", profile="quiet", network="external"),
    )
    assert alice.get("/v1/tools/out.tool").json()["network"] == "external"
    assert alice.get("/v1/tools/quiet.tool").json()["network"] == "none"
    assert bob.get("/v1/tools/out.tool").status_code == 404


def test_a_cgroup_that_cannot_be_made_fails_the_call_closed(alice, tenant_a, tmp_path, monkeypatch):
    apply(tenant_a, script_tool("calm", "print(json.dumps({'ok': True}))"))
    # The root vanished after it was found (an operator removed it): no unbounded run.
    monkeypatch.setattr(sandbox.CGROUPS, "root", lambda: (tmp_path / "gone", 1))
    response = alice.invoke("calm", {}, headers={"Accept-Language": "fr"})
    assert response.status_code == 503
    error = error_of(response)
    assert error["code"] == "tool_unavailable"
    assert "cgroup mémoire du bac à sable" in error["message_i18n"]["fr"]
    assert "memory cgroup could not be made" in error["message_i18n"]["en"]
    assert str(tmp_path) not in json.dumps(error)


def test_the_sandboxs_pid_1_shows_nothing_of_the_gateway(alice, tenant_a):
    """bwrap is PID 1 in the sandbox: its environment, working directory and command line
    are the tool's to read (/proc/1). None names the gateway's checkout or settings."""
    code = (
        "import base64\n"
        "def read(p):\n"
        "    try:\n"
        "        return base64.b64encode(open(p, 'rb').read()).decode()\n"
        "    except OSError as e:\n"
        "        return ''\n"
        "print(json.dumps({'environ': read('/proc/1/environ'), 'cmdline': read('/proc/1/cmdline'),"
        " 'cwd': os.readlink('/proc/1/cwd') if os.path.exists('/proc/1/cwd') else ''}))"
    )
    apply(tenant_a, script_tool("pid1", code))
    status, body = run(alice, "pid1")
    assert status == 200, body
    environ = base64.b64decode(body["output"]["environ"]).decode()
    cmdline = base64.b64decode(body["output"]["cmdline"]).decode()
    assert set(filter(None, environ.split("\0"))) <= {
        "PATH=/usr/sbin:/usr/bin:/sbin:/bin",
        "LANG=C.UTF-8",
    }, environ
    checkout = str(settings.BASE_DIR)
    assert checkout not in environ and checkout not in cmdline
    assert checkout not in body["output"]["cwd"]
