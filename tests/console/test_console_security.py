"""The console with security on (mode tls_jwt, HTTPS): a user signs in with a token and every call is made as
that user: an administrator sees and changes, a user without permissions sees refusals on each page and
changes nothing, a signed-out or expired session sees nothing (docs/CONSOLE.md, "Security")."""

from __future__ import annotations

import json
import secrets
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import jwt
import pytest
from selenium.webdriver.common.by import By

from danube_fast.proto import DanubeAdmin_pb2 as admin_pb
from danube_fast.proto import DanubeAdmin_pb2_grpc as admin_grpc
from danube_fast.security.tls import channel_credentials
from danube_fast.testing.broker import Broker
from danube_fast.testing.browser import chromium
from danube_fast.testing.certs import authority
from tests.compat.compat_support import run_async
from tests.console.conftest import Console

pytestmark = pytest.mark.browser

ISSUER, AUDIENCE = "danube-test", "danube"


class Secured:
    def __init__(self, root: Path) -> None:
        ca = authority(root / "ca")
        self.ca = ca.cert
        issued = ca.issue(root / "ca", "broker")
        self.secret = secrets.token_hex(32).encode()
        secret_file = root / "jwt.secret"
        secret_file.write_bytes(self.secret)
        self.broker = Broker(root / "broker", "\n".join([
            "[security]", 'mode = "tls_jwt"', f'cert_file = "{issued.cert}"', f'key_file = "{issued.key}"',
            f'ca_file = "{ca.cert}"', f'jwt_secret_file = "{secret_file}"', f'jwt_issuer = "{ISSUER}"',
            f'jwt_audience = "{AUDIENCE}"', 'super_admins = ["admin"]']) + "\n", console=True)

    def token(self, sub: str, ttl: float = 600) -> str:
        now = int(time.time())
        claims = {"sub": sub, "iss": ISSUER, "aud": AUDIENCE, "iat": now, "nbf": now, "exp": now + ttl}
        return jwt.encode(claims, self.secret, algorithm="HS256")


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    s = Secured(tmp_path_factory.mktemp("console-secured"))
    s.broker.start()
    try:
        async def topic() -> None:
            creds = grpc.composite_channel_credentials(channel_credentials(str(s.ca)),
                                                       grpc.access_token_call_credentials(s.token("admin")))
            async with grpc.aio.secure_channel(f"127.0.0.1:{s.broker.admin_port}", creds) as channel:
                await admin_grpc.TopicAdminStub(channel).CreateTopic(
                    admin_pb.NewTopicRequest(name="/default/guarded", dispatch_strategy=admin_pb.Reliable))
        run_async(topic())
        yield s
    finally:
        s.broker.close()


@pytest.fixture(scope="module")
def driver() -> Iterator[object]:
    d = chromium(insecure_tls=True)
    try:
        yield d
    finally:
        d.quit()


def _sign_in(console: Console, token: str) -> None:
    console.open("login")
    if console.all("sign-out"):
        console.click("sign-out")
        console.rendered("login")
    console.driver.find_element(By.ID, "token").send_keys(token)
    console.test("sign-in").click()
    console.rendered("overview")


def test_a_visitor_must_sign_in_and_a_bad_token_is_refused(driver, secured: Secured) -> None:  # type: ignore[no-untyped-def]
    console = Console(driver, secured.broker.console_url("https"), "sign-in")
    console.driver.get(console.base + "/#/topics")
    console.rendered("login")  # every page asks for a token first
    console.driver.find_element(By.ID, "token").send_keys("not-a-jwt")
    console.test("sign-in").click()
    assert "UNAUTHENTICATED" in console.text("error")
    console.shot("sign-in-refused")
    assert console.errors() == []


def test_an_administrator_sees_and_changes(driver, secured: Secured) -> None:  # type: ignore[no-untyped-def]
    console = Console(driver, secured.broker.console_url("https"), "admin")
    _sign_in(console, secured.token("admin"))
    assert "admin" in console.driver.find_element(By.ID, "who").text
    console.open("topics")
    assert "/default/guarded" in console.text("topics")
    console.open("security")
    console.test("role-name").send_keys("reader")
    console.driver.find_element(By.CSS_SELECTOR, 'input[aria-label="Lookup"]').click()
    console.driver.find_element(By.CSS_SELECTOR, 'input[aria-label="Consume"]').click()
    console.test("put-role").click()
    console.rendered("security")
    row = console.wait_for('[data-test="roles"] tbody tr', "reader")
    assert "Lookup, Consume" in row.text or "Consume, Lookup" in row.text, row.text
    console.test("bind-principal").send_keys("carol")
    console.test("bind-scope").clear()
    console.test("bind-scope").send_keys("/default")
    roles = [o.text for o in console.test("bind-role").find_elements(By.TAG_NAME, "option")]
    assert roles, "no roles to bind"
    console.test("bind").click()
    console.rendered("security")
    console.wait_for('[data-test="bindings"] tbody tr', "carol")
    console.shot("security")
    assert console.errors() == []


def test_a_user_without_permissions_sees_refusals_and_changes_nothing(driver, secured: Secured) -> None:  # type: ignore[no-untyped-def]
    console = Console(driver, secured.broker.console_url("https"), "nobody")
    _sign_in(console, secured.token("nobody"))
    for denied in (console.test("denied"),):
        assert "Not permitted" in denied.text
    console.shot("overview-denied")
    console.open("topics")
    assert "PERMISSION_DENIED" in console.text("error")
    console.open("topic?name=/default/guarded", "topic")
    assert "PERMISSION_DENIED" in console.text("error")
    console.open("browse?topic=/default/guarded", "browse")
    assert "Not permitted" in console.text("denied")
    console.open("security")
    assert "Not permitted" in console.text("denied")
    console.shot("security-denied")

    # A change through the API as this user (with the session's CSRF token): refused, nothing made.
    created = console.driver.execute_async_script("""
        const done = arguments[arguments.length - 1];
        fetch("/api/session").then(r => r.json()).then(s => fetch("/api/topics", {method: "POST",
          headers: {"Content-Type": "application/json", "X-CSRF-Token": s.csrf},
          body: JSON.stringify({name: "/default/by-nobody"})}))
          .then(r => r.json().then(b => done([r.status, b])));
    """)
    assert created[0] == 403 and created[1]["error"]["code"] == "PERMISSION_DENIED", created
    console.errors()  # the refusals above are expected

    async def names() -> list[str]:
        creds = grpc.composite_channel_credentials(channel_credentials(str(secured.ca)),
                                                   grpc.access_token_call_credentials(secured.token("admin")))
        async with grpc.aio.secure_channel(f"127.0.0.1:{secured.broker.admin_port}", creds) as channel:
            got = await admin_grpc.TopicAdminStub(channel).ListNamespaceTopics(admin_pb.NamespaceRequest(
                name="default"))
            return [t.name for t in got.topics]
    assert run_async(names()) == ["/default/guarded"]


def test_signing_out_and_expiry_end_the_session(driver, secured: Secured) -> None:  # type: ignore[no-untyped-def]
    console = Console(driver, secured.broker.console_url("https"), "expiry")
    _sign_in(console, secured.token("admin"))
    console.click("sign-out")
    console.rendered("login")
    console.open("topics", "login")  # signed out: back to the sign-in page

    # Long enough to sign in on a busy machine; then wait until it has expired (and the session with it).
    expires = time.time() + 8
    _sign_in(console, secured.token("admin", ttl=8))
    time.sleep(max(0.0, expires - time.time()) + 1.0)
    console.open("topics", "login")
    assert console.errors() == []


def test_the_session_cookie_is_secure_and_sign_in_needs_the_console_header(secured: Secured) -> None:
    base = secured.broker.console_url("https")
    context = ssl.create_default_context(cafile=str(secured.ca))
    body = json.dumps({"token": secured.token("admin")}).encode()
    request = urllib.request.Request(base + "/api/session", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, context=context)
    refused.value.close()
    assert refused.value.code == 403  # a cross-site form could send this much: refused
    request.add_header("X-Requested-With", "danube-console")
    with urllib.request.urlopen(request, context=context) as r:
        cookie = r.headers["Set-Cookie"]
        answer = json.loads(r.read())
    assert "Secure" in cookie and "HttpOnly" in cookie and "SameSite=Strict" in cookie
    assert "token" not in answer and secured.token("admin")[:20] not in json.dumps(answer)
