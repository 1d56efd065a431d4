"""The admin's failed-login lock holds per (account, client address): five wrong
passwords from one address lock that account from that address only, and the address
comes from X-Forwarded-For only when the peer is a trusted proxy (EAI_TRUSTED_PROXIES).
Before, five failures from one address locked every account from it: behind a proxy,
anyone could lock all staff out."""

from __future__ import annotations

import pytest
from django.core.cache import cache
from django.test import Client, RequestFactory

from tenants import lockout

from .test_admin_portal import PASSWORD, staff

ATTACKER = "203.0.113.7"
RITA_HOME = "198.51.100.9"
PROXY = "10.0.0.5"
LOCKED = "Too many failed login attempts"


@pytest.fixture(autouse=True)
def _fresh_counters(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    cache.clear()  # the counters live in the cache, which outlives a test's database
    yield
    cache.clear()


@pytest.fixture
def rita(tenant_a, tenant_b):
    staff("sam", tenant_b)
    return staff("rita", tenant_a)


def login(username: str, password: str, *, peer: str, forwarded: str | None = None):
    headers = {"X-Forwarded-For": forwarded} if forwarded is not None else {}
    client = Client(REMOTE_ADDR=peer, headers=headers)
    response = client.post(
        "/admin/login/?next=/admin/", {"username": username, "password": password}
    )
    return response.status_code, response.content.decode()


def test_failures_from_one_address_lock_that_account_there_only(rita):
    for _ in range(lockout.LIMIT):
        assert login("rita", "wrong", peer=ATTACKER)[0] == 200
    status, page = login("rita", PASSWORD, peer=ATTACKER)
    assert status == 200 and LOCKED in page  # even the right password, from there
    assert login("rita", PASSWORD, peer=RITA_HOME)[0] == 302  # rita, from her desk
    assert login("sam", PASSWORD, peer=ATTACKER)[0] == 302  # another account, same address


def test_an_address_trying_many_accounts_locks_none_of_the_others(rita):
    for index in range(3 * lockout.LIMIT):
        login(f"guess{index}", "wrong", peer=ATTACKER)
    assert login("rita", PASSWORD, peer=ATTACKER)[0] == 302


def test_behind_a_trusted_proxy_the_forwarded_client_is_counted(rita, settings):
    settings.EAI_TRUSTED_PROXIES = ["10.0.0.0/8"]
    for _ in range(lockout.LIMIT):
        login("rita", "wrong", peer=PROXY, forwarded=ATTACKER)
    status, page = login("rita", PASSWORD, peer=PROXY, forwarded=ATTACKER)
    assert LOCKED in page
    # Every client shares the proxy's address; rita's own is hers.
    assert login("rita", PASSWORD, peer=PROXY, forwarded=RITA_HOME)[0] == 302


def test_a_forwarded_header_from_anyone_else_is_ignored(rita, settings):
    """The attacker writes rita's address into the header: counted as the attacker."""
    settings.EAI_TRUSTED_PROXIES = ["10.0.0.0/8"]
    for _ in range(lockout.LIMIT):
        login("rita", "wrong", peer=ATTACKER, forwarded=RITA_HOME)
    assert login("rita", PASSWORD, peer=RITA_HOME)[0] == 302
    assert LOCKED in login("rita", PASSWORD, peer=ATTACKER)[1]


def test_without_trusted_proxies_the_header_is_ignored(rita):
    for _ in range(lockout.LIMIT):
        login("rita", "wrong", peer=PROXY, forwarded=ATTACKER)
    assert LOCKED in login("rita", PASSWORD, peer=PROXY, forwarded=RITA_HOME)[1]


@pytest.mark.parametrize(
    "peer, forwarded, client",
    [
        (PROXY, None, PROXY),
        (PROXY, "", PROXY),
        (PROXY, ATTACKER, ATTACKER),
        # What the client wrote left of its own address is not believed.
        (PROXY, f"{RITA_HOME}, {ATTACKER}", ATTACKER),
        # Two trusted proxies in a row: the nearest untrusted hop.
        (PROXY, f"{RITA_HOME}, {ATTACKER}, 10.1.2.3", ATTACKER),
        (PROXY, "10.1.2.3, 10.9.9.9", "10.1.2.3"),
        # Junk where an address should be: the proxy stands for its client.
        (PROXY, "not-an-address", PROXY),
        (PROXY, f"{ATTACKER}, junk", PROXY),
        (ATTACKER, RITA_HOME, ATTACKER),
        ("2001:db8::1", RITA_HOME, "2001:db8::1"),
        ("fd00::1", ATTACKER, ATTACKER),
        (f"::ffff:{PROXY}", ATTACKER, ATTACKER),
        (PROXY, f"::ffff:{ATTACKER}", ATTACKER),
    ],
)
def test_it_reads_the_client_address(settings, peer, forwarded, client):
    settings.EAI_TRUSTED_PROXIES = ["10.0.0.0/8", "fd00::/8"]
    meta = {"REMOTE_ADDR": peer}
    if forwarded is not None:
        meta["HTTP_X_FORWARDED_FOR"] = forwarded
    request = RequestFactory().get("/admin/login/", **meta)
    assert lockout.client_ip(request) == client


def test_a_bad_trusted_proxy_setting_stops_the_start(monkeypatch):
    import importlib

    from django.core.exceptions import ImproperlyConfigured

    import eai.settings

    monkeypatch.setenv("EAI_TRUSTED_PROXIES", "10.0.0.0/8, not-a-network")
    with pytest.raises(ImproperlyConfigured, match="not-a-network"):
        importlib.reload(eai.settings)
    monkeypatch.delenv("EAI_TRUSTED_PROXIES")
    importlib.reload(eai.settings)
