"""Every page of the console in a real headless Chromium against a standalone broker holding data: what each
page shows is checked against what was produced, the operations change what the admin API then reports,
hostile strings render as text, and the page logs no error (docs/CONSOLE.md)."""

from __future__ import annotations

import base64
import io
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import fastavro
import grpc
import pytest
from selenium.webdriver.common.alert import Alert
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

from danube_fast.codec import frames
from danube_fast.proto import DanubeAdmin_pb2 as admin_pb
from danube_fast.proto import DanubeAdmin_pb2_grpc as admin_grpc
from danube_fast.proto import PolicyAdmin_pb2 as policy_pb
from danube_fast.proto import PolicyAdmin_pb2_grpc as policy_grpc
from danube_fast.proto import SchemaRegistry_pb2 as schema_pb
from danube_fast.proto import SchemaRegistry_pb2_grpc as schema_grpc
from danube_fast.proto import SubscriptionAdmin_pb2 as subs_pb
from danube_fast.proto import SubscriptionAdmin_pb2_grpc as subs_grpc
from danube_fast.testing.broker import Broker
from tests.compat.compat_support import run_async
from tests.console.conftest import WAIT_S, Console
from tests.console.conftest import producing as _producer

pytestmark = pytest.mark.browser

PLAIN = "/default/plain"
AVRO = "/default/users"
PARTED = "/default/parted"
SUB = "audit"
# What an attacker controls and the broker accepts: a topic name holds only letters, digits, '_' and '-'
# (names.py refuses the rest), so the hostile strings ride in a subscription name, a producer name, a key,
# attributes and payloads.
XSS_IMG = "<img src=x onerror=window.__xss=1>"
XSS_SCRIPT = "<script>window.__xss=2</script>"
XSS_LINK = "javascript:window.__xss=3"
USER_V1 = {"type": "record", "name": "User", "fields": [{"name": "name", "type": "string"},
                                                         {"name": "age", "type": "int"}]}
USER_V2 = {"type": "record", "name": "User", "fields": [{"name": "name", "type": "string"},
                                                         {"name": "age", "type": "int"},
                                                         {"name": "email", "type": ["null", "string"],
                                                          "default": None}]}


@dataclass
class Loaded:
    broker: Broker
    times: list[int]  # the publish time of each record of PLAIN (offset = index)
    schema_id: int


def _admin(broker: Broker) -> str:
    return f"127.0.0.1:{broker.admin_port}"


async def _position(broker: Broker, subscription: str) -> int:
    async with grpc.aio.insecure_channel(_admin(broker)) as channel:
        got = await subs_grpc.SubscriptionAdminStub(channel).Describe(
            subs_pb.DescribeRequest(topic=PLAIN, subscription=subscription))
        return got.partitions[0].position


def _avro(schema: dict[str, object], datum: dict[str, object]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), datum)
    return out.getvalue()


async def _load(broker: Broker) -> Loaded:
    async with grpc.aio.insecure_channel(_admin(broker)) as channel:
        topics = admin_grpc.TopicAdminStub(channel)
        await topics.CreatePartitionedTopic(admin_pb.PartitionedTopicRequest(
            base_name=PARTED, partitions=2, dispatch_strategy=admin_pb.Reliable))
        await topics.CreateTopic(admin_pb.NewTopicRequest(name=PLAIN, dispatch_strategy=admin_pb.Reliable))
        # Two subscriptions before the records, so that they have a backlog to seek over.
        for name in (SUB, XSS_IMG):
            await subs_grpc.SubscriptionAdminStub(channel).Create(
                subs_pb.CreateRequest(topic=PLAIN, subscription=name, earliest=True))
        registry = schema_grpc.SchemaRegistryStub(channel)
        first = await registry.RegisterSchema(schema_pb.RegisterSchemaRequest(
            subject="users", schema_type="avro", schema_definition=json.dumps(USER_V1).encode()))
        await registry.RegisterSchema(schema_pb.RegisterSchemaRequest(
            subject="users", schema_type="avro", schema_definition=json.dumps(USER_V2).encode()))
    times = []
    async with _producer(broker.target, PLAIN, XSS_SCRIPT.replace("/", "")) as producer:
        for batch in range(3):
            times += [int(time.time() * 1000)] * 10  # the batch's publish time
            records = [frames.Record(json.dumps({"n": n, "text": f"hello {n}"}).encode(), times[-1],
                                     routing_key=f"k{n}", attributes={"a": str(n)})
                       for n in range(batch * 10, batch * 10 + 10)]
            await (await producer.send_records(records))
            time.sleep(0.05)  # each batch of ten has a later publish time
        await (await producer.send_records([frames.Record(
            (XSS_SCRIPT + XSS_IMG).encode(), int(time.time() * 1000), routing_key=XSS_SCRIPT,
            attributes={XSS_LINK: XSS_IMG})]))
    async with _producer(broker.target, AVRO, "avro-writer") as producer:
        await (await producer.send_records([frames.Record(
            _avro(USER_V1, {"name": f"user{n}", "age": 20 + n}), schema_id=first.schema_id, schema_version=1)
            for n in range(5)]))
    for part in range(2):
        async with _producer(broker.target, f"{PARTED}-part-{part}", "parted-writer") as producer:
            await (await producer.send_batch([f"p{part}-{n}".encode() for n in range(4)]))
    return Loaded(broker, times, first.schema_id)


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Loaded]:
    broker = Broker(tmp_path_factory.mktemp("console"), console=True)
    broker.start()
    try:
        yield run_async(_load(broker))
    finally:
        broker.close()


@pytest.fixture
def console(driver, loaded: Loaded, request: pytest.FixtureRequest) -> Iterator[Console]:  # type: ignore[no-untyped-def]
    c = Console(driver, loaded.broker.console_url(), request.node.name.split("[")[0].removeprefix("test_"))
    c.errors()  # what earlier tests left in the log
    yield c
    assert driver.execute_script("return window.__xss === undefined"), "a hostile string ran as script"
    assert c.errors() == [], "the page logged errors"


def test_overview_shows_the_broker_its_namespaces_and_charts(console: Console, loaded: Loaded) -> None:
    console.open("overview")
    brokers = console.rows("brokers")
    assert len(brokers) == 1 and brokers[0][4] == "leader", brokers
    assert _namespaces(console) == ["default", "system"]
    assert len(console.all("chart")) == 2
    console.wait_for("#main", "Messages in\n44")  # 31 + 5 + 8 records produced by the fixture
    console.shot("overview")


def _namespaces(console: Console) -> list[str]:
    return list(console.read("namespaces", lambda el: [li.text.removesuffix(" Delete")
                                                       for li in el.find_elements(By.TAG_NAME, "li")]))


def test_a_namespace_is_created_and_deleted_from_the_overview(console: Console) -> None:
    console.open("overview")
    console.test("new-namespace").send_keys("scratch")
    console.test("create-namespace").click()
    console.rendered("overview")
    WebDriverWait(console.driver, WAIT_S).until(lambda d: "scratch" in _namespaces(console))
    row = next(li for li in console.test("namespaces").find_elements(By.TAG_NAME, "li")
               if li.text.startswith("scratch"))
    row.find_element(By.CSS_SELECTOR, '[data-test="delete-namespace"]').click()
    Alert(console.driver).accept()
    WebDriverWait(console.driver, WAIT_S).until(lambda d: _namespaces(console) == ["default", "system"])


def test_topics_are_listed_filtered_created_and_deleted(console: Console) -> None:
    console.open("topics")
    names = [r[0] for r in console.rows("topics")]
    assert names == sorted([PLAIN, AVRO, PARTED]), names
    parted = next(r for r in console.rows("topics") if r[0] == PARTED)
    assert parted[1] == "Reliable" and parted[2] == "2"
    console.test("filter").send_keys("user")
    WebDriverWait(console.driver, WAIT_S).until(
        lambda d: [r[0] for r in console.rows("topics")] == [AVRO])
    console.shot("topics-filtered")
    console.test("filter").clear()

    console.test("new-name").send_keys("/default/made-here")
    console.test("new-partitions").clear()
    console.test("new-partitions").send_keys("3")
    console.test("create-topic").click()
    console.wait_for('[data-test="notice"]', "Created /default/made-here")
    row = console.wait_for('[data-test="topics"] tbody tr', "/default/made-here")
    assert row.find_elements(By.TAG_NAME, "td")[2].text == "3"
    console.shot("topics-created")

    # A name the broker refuses: its message, and nothing created.
    console.test("new-name").clear()
    console.test("new-name").send_keys("/default/bad name!")
    console.test("new-partitions").clear()
    console.test("create-topic").click()
    error = console.wait_for('[data-test="error"]')
    assert "INVALID_ARGUMENT" in error.text, error.text

    delete = next(tr for tr in console.test("topics").find_elements(By.CSS_SELECTOR, "tbody tr")
                  if tr.find_elements(By.TAG_NAME, "td")[0].text == "/default/made-here")
    delete.find_element(By.CSS_SELECTOR, '[data-test="delete-topic"]').click()
    Alert(console.driver).dismiss()  # asked first: nothing happens on "cancel"
    assert "/default/made-here" in console.text("topics")
    delete.find_element(By.CSS_SELECTOR, '[data-test="delete-topic"]').click()
    Alert(console.driver).accept()
    console.wait_for('[data-test="notice"]', "Deleted /default/made-here")
    console.open("overview")
    console.open("topics")
    assert "/default/made-here" not in console.text("topics")


def test_topic_detail_shows_subscriptions_and_seeks_one(console: Console, loaded: Loaded) -> None:
    console.open(f"topic?name={PLAIN}", "topic")
    partitions = console.rows("partitions")
    assert partitions[0][0] == PLAIN and partitions[0][3] == "0 … 31", partitions
    subs = {r[0]: r for r in console.rows("subscriptions")}
    assert set(subs) == {SUB, XSS_IMG}, subs  # the hostile name shown as text
    assert subs[SUB][5] == "31"  # lag: every record
    assert console.text("policy").startswith("{")
    console.shot("topic")

    row = next(tr for tr in console.test("subscriptions").find_elements(By.CSS_SELECTOR, "tbody tr")
               if tr.find_elements(By.TAG_NAME, "td")[0].text == SUB)
    Select(row.find_element(By.TAG_NAME, "select")).select_by_value("offset")
    row.find_element(By.CSS_SELECTOR, '[data-test="seek-value"]').send_keys("20")
    row.find_element(By.CSS_SELECTOR, '[data-test="seek"]').click()
    console.wait_for('[data-test="notice"]', f"{PLAIN} 0 → 20")

    assert run_async(_position(loaded.broker, SUB)) == 20
    console.rendered("topic")  # the page refreshes itself after an operation
    console.wait_for('[data-test="subscriptions"] tbody tr', "11")  # lag 31 - 20

    row = next(tr for tr in console.test("subscriptions").find_elements(By.CSS_SELECTOR, "tbody tr")
               if tr.find_elements(By.TAG_NAME, "td")[0].text == SUB)
    row.find_element(By.CSS_SELECTOR, '[data-test="seek-value"]').send_keys("3")
    row.find_element(By.CSS_SELECTOR, '[data-test="skip"]').click()
    console.wait_for('[data-test="notice"]', "Skipped 3 records")
    assert run_async(_position(loaded.broker, SUB)) == 23


def _values(console: Console) -> list[str]:
    return console.texts("value")


def _offsets(console: Console) -> list[int]:
    return [int(r[0]) for r in console.rows("records")]


def test_the_browser_reads_by_offset_and_time_forwards_and_backwards(console: Console,
                                                                     loaded: Loaded) -> None:
    console.open(f"browse?topic={PLAIN}&from=offset:5&count=10", "browse")
    assert _offsets(console) == list(range(5, 15))
    assert _values(console)[0] == '{"n": 5, "text": "hello 5"}'
    first = console.rows("records")[0]
    assert first[3] == "k5" and first[5] == "a: 5" and first[4] == XSS_SCRIPT.replace("/", "")
    console.shot("browse")

    console.test("newer").click()
    console.rendered("browse")
    assert _offsets(console) == list(range(15, 25))
    console.test("older").click()
    console.rendered("browse")
    assert _offsets(console) == list(range(5, 15))  # the ten before 15

    console.open(f"browse?topic={PLAIN}&from=latest&count=4&backward=1", "browse")
    assert _offsets(console) == [27, 28, 29, 30]
    console.open(f"browse?topic={PLAIN}&from=time:{loaded.times[20]}&count=3", "browse")
    assert _offsets(console) == [20, 21, 22]

    console.open(f"browse?topic={PLAIN}&from=offset:2&count=1&format=json", "browse")
    assert json.loads(_values(console)[0]) == {"n": 2, "text": "hello 2"}
    console.open(f"browse?topic={PLAIN}&from=offset:2&count=1&format=hex", "browse")
    assert _values(console)[0].startswith("000000  7b 22 6e 22")  # {"n"

    assert run_async(_position(loaded.broker, XSS_IMG)) == 0  # reading moved nothing


def test_avro_values_decode_with_their_schema(console: Console, loaded: Loaded) -> None:
    console.open(f"browse?topic={AVRO}&from=earliest&count=5&format=avro", "browse")
    expected = [{"name": f"user{n}", "age": 20 + n} for n in range(5)]
    assert [json.loads(v) for v in _values(console)] == expected
    assert console.rows("records")[0][6] == f"id {loaded.schema_id} v1"
    console.shot("browse-avro")


def test_a_partitioned_topic_is_read_per_partition(console: Console) -> None:
    console.open(f"browse?topic={PARTED}&from=earliest&count=100", "browse")
    rows = console.rows("records")
    assert len(rows) == 8 and {r[1] for r in rows} <= {f"{PARTED}-part-0", f"{PARTED}-part-1"}
    assert not console.all("older")  # paging needs one partition: the page links each
    console.driver.find_element(By.LINK_TEXT, f"{PARTED}-part-0").click()
    console.rendered("browse")
    assert {r[1] for r in console.rows("records")} == {f"{PARTED}-part-0"}


def test_the_raw_value_downloads_byte_for_byte(console: Console, loaded: Loaded) -> None:
    console.open(f"browse?topic={PLAIN}&from=offset:30&count=1", "browse")
    href = console.test("download").get_attribute("href")
    got = console.driver.execute_async_script("""
        const done = arguments[arguments.length - 1];
        fetch(arguments[0], {credentials: "same-origin"}).then(r => r.arrayBuffer())
          .then(b => done(btoa(String.fromCharCode(...new Uint8Array(b))))).catch(e => done("failed " + e));
    """, href)
    assert base64.b64decode(got) == (XSS_SCRIPT + XSS_IMG).encode()


def test_hostile_strings_render_as_text(console: Console) -> None:
    console.open(f"browse?topic={PLAIN}&from=offset:30&count=1", "browse")
    row = console.rows("records")[0]
    assert row[3] == XSS_SCRIPT and row[5] == f"{XSS_LINK}: {XSS_IMG}"
    assert row[7].startswith(XSS_SCRIPT + XSS_IMG)
    main = console.driver.find_element(By.ID, "main")
    assert main.find_elements(By.CSS_SELECTOR, "img, script, iframe, object, embed") == []
    links = [a.get_attribute("href") for a in main.find_elements(By.TAG_NAME, "a")]
    assert not any(h.startswith("javascript:") for h in links if h), links
    console.open(f"topic?name={PLAIN}", "topic")
    assert main.find_elements(By.CSS_SELECTOR, "img, script, iframe") == []
    console.shot("hostile")


def test_schemas_list_versions_diff_and_check(console: Console) -> None:
    console.open("schemas")
    rows = console.rows("subjects")
    assert rows == [["users", "avro", "2", rows[0][3]]], rows
    console.driver.find_element(By.LINK_TEXT, "users").click()
    console.rendered("schema")
    assert [r[0] for r in console.rows("versions")] == ["1", "2"]
    diff = console.test("diff")
    added = [d.text for d in diff.find_elements(By.CSS_SELECTOR, ".add")]
    assert any('"email"' in line for line in added), added
    console.shot("schema")
    console.test("check-definition").send_keys(json.dumps(
        {"type": "record", "name": "User", "fields": [{"name": "name", "type": "int"}]}))
    console.test("check").click()
    console.wait_for('[data-test="verdict"]', "Not compatible")
    console.test("check-definition").clear()
    console.test("check-definition").send_keys(json.dumps(USER_V2))
    console.test("check").click()
    console.wait_for('[data-test="verdict"]', "Compatible")
    Select(console.test("mode")).select_by_value("Full")
    console.test("set-mode").click()
    console.rendered("schema")
    console.wait_for("#main", "Compatibility mode: full")  # as the registry spells it
    assert Select(console.test("mode")).first_selected_option.text == "Full"


def test_security_says_it_is_off(console: Console) -> None:
    console.open("security")
    assert "Security is off" in console.text("security-off")


def test_the_api_refuses_bad_input_changes_without_csrf_and_foreign_origins(loaded: Loaded) -> None:
    base = loaded.broker.console_url()
    with urllib.request.urlopen(base + "/api/session") as r:
        cookie = r.headers["Set-Cookie"]
        csp = r.headers["Content-Security-Policy"]
        session = json.loads(r.read())
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and "unsafe-inline" not in csp
    jar = cookie.split(";")[0]

    def call(method: str, path: str, body: object = None, **headers: str) -> tuple[int, dict[str, object]]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(base + path, data=data, method=method,
                                     headers={"Cookie": jar, "Content-Type": "application/json", **headers})
        try:
            with urllib.request.urlopen(req) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    status, answer = call("POST", "/api/topics", {"name": "/default/csrf-less"})
    assert status == 403 and "X-CSRF-Token" in str(answer), answer
    status, answer = call("POST", "/api/topics", {"name": "/default/foreign"}, Origin="http://evil.example",
                          **{"X-CSRF-Token": str(session["csrf"])})
    assert status == 403, answer
    status, answer = call("GET", f"/api/records?topic={PLAIN}&count=1001")
    assert status == 400 and "count" in str(answer), answer
    status, answer = call("GET", "/api/records?topic=/default/none&from=earliest")
    assert status == 404, answer
    status, answer = call("GET", f"/api/records?topic={PLAIN}&from=offset:abc")
    assert status == 400 and "offset" in str(answer), answer
    status, answer = call("GET", "/api/topics")
    assert status == 200 and "/default/csrf-less" not in str(answer) and "/default/foreign" not in str(answer)
    status, answer = call("GET", "/api/topics", Cookie="danube_console=forged")
    assert status == 401, answer


def test_a_long_topic_list_is_shown_a_page_at_a_time(console: Console, loaded: Loaded) -> None:
    """After the tests that count topics: it adds 120 to the broker the others share."""
    async def create() -> None:
        async with grpc.aio.insecure_channel(_admin(loaded.broker)) as channel:
            namespaces = admin_grpc.NamespaceAdminStub(channel)
            await namespaces.CreateNamespace(admin_pb.NamespaceRequest(name="many"))
            stub = admin_grpc.TopicAdminStub(channel)
            for n in range(120):
                await stub.CreateTopic(admin_pb.NewTopicRequest(name=f"/many/t{n:03d}",
                                                                dispatch_strategy=admin_pb.Reliable))
    run_async(create())
    console.open("topics")
    assert len(console.rows("topics")) == 100
    assert console.text("more") == "Show 23 more"  # 123 topics in all
    console.test("more").click()
    console.wait_for('[data-test="topics"] tbody tr', "/many/t119")
    assert len(console.rows("topics")) == 123 and not console.all("more")
    console.test("filter").send_keys("t11")
    WebDriverWait(console.driver, WAIT_S).until(lambda d: len(console.rows("topics")) == 10)


def test_a_topics_table_shows_its_status_and_partitioning(console: Console, loaded: Loaded) -> None:
    """After the topic list's count (this adds a topic): a topic whose policy turns a day-partitioned table
    on shows the table's status on its page once the writer committed its records."""
    topic = "/default/tabled"

    async def tabled() -> None:
        async with grpc.aio.insecure_channel(_admin(loaded.broker)) as channel:
            await admin_grpc.TopicAdminStub(channel).CreateTopic(
                admin_pb.NewTopicRequest(name=topic, dispatch_strategy=admin_pb.Reliable))
            await policy_grpc.PolicyAdminStub(channel).SetTopicPolicy(policy_pb.SetTopicPolicyRequest(
                topic=topic, changes=json.dumps({"tableMode": "envelope", "tablePartitioning": "day"})))
        async with _producer(loaded.broker.target, topic, "table-writer") as producer:
            await (await producer.send_batch([b"row-%d" % n for n in range(6)]))

    run_async(tabled())
    deadline = time.monotonic() + 60  # the writer reads policies every 5 s and commits at once
    while True:
        console.open(f"topic?name={topic}", "topic")
        rows = console.rows("table") if console.all("table") else []  # "No table" until its first pass
        if rows and rows[0][3] == "6":
            break
        assert time.monotonic() < deadline, f"the table's status did not reach offset 6: {rows}"
        time.sleep(1)
    assert rows[0][:3] == [topic, "envelope", "default.tabled"] and rows[0][6] == "day", rows
