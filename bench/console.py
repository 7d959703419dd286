"""`python -m bench console`: the web console (docs/CONSOLE.md) in Debian's headless Chromium against a broker
holding many topics: the time to a rendered page, and what an open console costs the broker's produce and
consume.

One standalone broker (the harness's, its console on a free loopback port) gets TOPICS Reliable topics spread
over NAMESPACES, every LOADED_EVERY-th holding RECORDS_EACH records. HOT, one of them, has SUBSCRIPTIONS
subscriptions (made at the earliest position: each has the topic's records as backlog) and HOT_RECORDS Avro
records of SUBJECT, a subject with two versions. The same broker and browser serve every run; per run:

- `<page>_ms`: each page (`pages()`) opened OPENS times, the pages in turn so that every open is a navigation:
  from setting location.hash in the page (the console's router draws the page for it) until <main> carries
  data-rendered="<page>", timed in the browser (performance.now() and a MutationObserver), so WebDriver's
  round trips are not counted. The run's figure is the median of its opens. Baseline: the page's JSON
  endpoint alone, fetched with urllib in the same session (median of as many calls): the rest of the page's
  time is the browser's (its fetch and JSON parse, the DOM built). Target: under 1 s (docs/CONSOLE.md).
  After every open the page is checked: no error box, and every row it must show.
- `<page>_painted_ms`: the same opens, until the frame after the mark was drawn (a task queued from the next
  animation frame ran): style, layout and paint of what the page built, which the mark does not cover.
- `first_load_ms`: the console opened afresh (driver.get of the overview's URL, the browser cache cleared
  first) until the overview rendered: the document, its ES modules and style, the session, the overview.
- `produce_console_<mode>`, `consume_console_<mode>`: FastProducer.send_batch of BATCH_RECORDS records of
  RECORD_BYTES to a new Reliable topic for PRODUCE_S seconds (at most IN_FLIGHT batches unacknowledged),
  then flush; then a FastConsumer catching up on all of it (cumulative acks). Three modes a run, their order
  turned around every other run: `closed`, the browser on about:blank (the baseline); `overview`, the
  console open on its overview, which refreshes itself every 5 s (what "a console open and refreshing" is
  in use: the target, at least 0.95 of the baseline); `reloading`, a stress: the overview in one window and
  the topics page of every topic reloaded RELOAD_MS after it last rendered in a second (no target: on this
  2-core machine the browser's own work takes from the broker's cores). Ratios are medians of the per-run
  ratios. The load topic is a new one each time.
- `topics_reloads_per_s`: how often the second window's topics page rendered during the `reloading` produce
  and consume: the load the console put on the broker meanwhile.
"""

from __future__ import annotations

import asyncio
import http.cookiejar
import io
import json
import shutil
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import fastavro
import grpc
import uvloop
from selenium import webdriver

from bench.common import Options, Result, Target, median, paired_ratio, progress
from danube_fast.client import FastConsumer, FastProducer
from danube_fast.codec import frames
from danube_fast.proto import DanubeAdmin_pb2 as admin_pb
from danube_fast.proto import DanubeAdmin_pb2_grpc as admin_grpc
from danube_fast.proto import SchemaRegistry_pb2 as schema_pb
from danube_fast.proto import SchemaRegistry_pb2_grpc as schema_grpc
from danube_fast.proto import SubscriptionAdmin_pb2 as subs_pb
from danube_fast.proto import SubscriptionAdmin_pb2_grpc as subs_grpc
from danube_fast.testing.broker import Broker
from danube_fast.testing.browser import chromium

TOPICS = 1_000
QUICK_TOPICS = 100
SUBSCRIPTIONS = 100
QUICK_SUBSCRIPTIONS = 20
NAMESPACES = ("default", "orders", "sensors", "billing")
LOADED_EVERY = 10
RECORDS_EACH = 10
HOT = "/default/hot"
HOT_RECORDS = 1_000
BROWSE_RECORDS = 100
SUBJECT = "users"
OPENS = 5
QUICK_OPENS = 2
PRODUCE_S = 4.0
QUICK_PRODUCE_S = 0.5
RECORD_BYTES = 256
BATCH_RECORDS = 1_000  # as bench/fast.py
IN_FLIGHT = 64
RELOAD_MS = 1_000
SETTLE_S = 1.0  # after the console windows opened, before the produce starts
SCRIPT_TIMEOUT_S = 60.0
CREATING = 16  # admin calls in flight while the topics are made
PAGE_TARGET = Target("< 1,000 ms", "<=", 1000.0)
LOAD_TARGET = Target(">= 0.95x no console", ">=", 0.95, of="ratio")
USER_V1 = {"type": "record", "name": "User", "fields": [{"name": "name", "type": "string"},
                                                         {"name": "age", "type": "int"}]}
USER_V2 = {"type": "record", "name": "User", "fields": [{"name": "name", "type": "string"},
                                                         {"name": "age", "type": "int"},
                                                         {"name": "email", "type": ["null", "string"],
                                                          "default": None}]}
Figures = dict[str, float]

# Navigation, timed in the page: resolves with the ms from setting the hash to the page's data-rendered mark,
# and to the end of the next frame (a task queued from the next animation frame runs once it is drawn).
NAVIGATE_JS = """
const [hash, page, done] = arguments;
const main = document.getElementById("main");
const started = performance.now();
const seen = new MutationObserver(() => {
  if (main.getAttribute("data-rendered") !== page) return;
  seen.disconnect();
  const rendered = performance.now() - started;
  requestAnimationFrame(() => setTimeout(() => done([rendered, performance.now() - started])));
});
seen.observe(main, { attributes: true, attributeFilter: ["data-rendered"] });
if (location.hash === hash) window.dispatchEvent(new Event("danube-render"));
else location.hash = hash;
"""
# Added to every document of the first window before its own scripts: when <main> was first marked rendered,
# in ms since the navigation began.
MARK_JS = """
new MutationObserver((changes, seen) => {
  const main = document.getElementById("main");
  if (!main || !main.hasAttribute("data-rendered")) return;
  seen.disconnect();
  window.__danubeFirstRender = performance.now();
}).observe(document, { subtree: true, attributes: true, attributeFilter: ["data-rendered"] });
"""
FIRST_RENDER_JS = """
const done = arguments[arguments.length - 1];
const check = () => window.__danubeFirstRender === undefined ? setTimeout(check, 5)
                                                               : done(window.__danubeFirstRender);
check();
"""
# Added to every document of the second window: the topics page reloaded RELOAD_MS after it rendered.
RELOAD_LOOP_JS = """
new MutationObserver((changes, seen) => {
  const main = document.getElementById("main");
  if (!main || main.getAttribute("data-rendered") !== "topics") return;
  seen.disconnect();
  sessionStorage.setItem("reloads", String(Number(sessionStorage.getItem("reloads") || 0) + 1));
  setTimeout(() => location.reload(), RELOAD_MS);
}).observe(document, { subtree: true, attributes: true, attributeFilter: ["data-rendered"] });
""".replace("RELOAD_MS", str(RELOAD_MS))
CHECK_JS = """
const [table] = arguments;
const main = document.getElementById("main");
const error = main.querySelector(".error");
return { error: error ? error.textContent : null,
         rows: main.querySelectorAll(`[data-test="${table}"] tbody tr`).length };
"""


@dataclass(frozen=True)
class Page:
    name: str  # the figure's name and the page's data-rendered mark
    route: str  # the location.hash that shows it, without "#/"
    api: str  # the JSON endpoint it draws, with its query
    table: str  # data-test of its table whose rows are counted
    rows: int  # ... and how many it must show


TOPICS_PAGE_ROWS = 100


def pages(topics: int, subscriptions: int) -> list[Page]:
    """The timed pages, the overview last: the runs begin on it, and every open must be a navigation."""
    hot = urlencode({"name": HOT})
    browse = urlencode({"topic": HOT, "from": "earliest", "count": BROWSE_RECORDS, "backward": "0"})
    subject = urlencode({"subject": SUBJECT})
    return [
        # The page lists every topic's data and draws the first TOPICS_PAGE_ROWS rows (topics.js PAGE_ROWS).
        Page("topics", "topics", "/api/topics", "topics", min(topics, TOPICS_PAGE_ROWS)),
        Page("topic", f"topic?{hot}", f"/api/topic?{hot}", "subscriptions", subscriptions),
        Page("browse", f"browse?{browse}&format=avro", f"/api/records?{browse}", "records", BROWSE_RECORDS),
        Page("schemas", "schemas", "/api/schemas", "subjects", 1),
        Page("schema", f"schema?{subject}", f"/api/schema?{subject}", "versions", 2),
        Page("overview", "overview", "/api/overview", "brokers", 1),
    ]


def topic_names(topics: int) -> list[str]:
    """HOT and topics - 1 more, spread over NAMESPACES."""
    return [HOT, *(f"/{NAMESPACES[i % len(NAMESPACES)]}/topic-{i:04d}" for i in range(1, topics))]


def avro(schema: dict[str, Any], datum: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), datum)
    return out.getvalue()


async def populate(broker: Broker, topics: int, subscriptions: int) -> None:
    """The topics, namespaces, subscriptions, subject and records the pages show."""
    names = topic_names(topics)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{broker.admin_port}") as channel:
        namespaces: Any = admin_grpc.NamespaceAdminStub(channel)  # type: ignore[no-untyped-call]
        admin: Any = admin_grpc.TopicAdminStub(channel)  # type: ignore[no-untyped-call]
        subs: Any = subs_grpc.SubscriptionAdminStub(channel)  # type: ignore[no-untyped-call]
        registry: Any = schema_grpc.SchemaRegistryStub(channel)  # type: ignore[no-untyped-call]
        for ns in NAMESPACES[1:]:
            await namespaces.CreateNamespace(admin_pb.NamespaceRequest(name=ns), timeout=30)
        slots = asyncio.Semaphore(CREATING)

        async def create(name: str) -> None:
            async with slots:
                await admin.CreateTopic(admin_pb.NewTopicRequest(
                    name=name, dispatch_strategy=admin_pb.Reliable), timeout=30)

        await asyncio.gather(*(create(name) for name in names))
        await asyncio.gather(*(subs.Create(subs_pb.CreateRequest(topic=HOT, subscription=f"sub-{i:03d}",
                                                                 earliest=True), timeout=30)
                               for i in range(subscriptions)))
        first = await registry.RegisterSchema(schema_pb.RegisterSchemaRequest(
            subject=SUBJECT, schema_type="avro", schema_definition=json.dumps(USER_V1).encode()), timeout=30)
        await registry.RegisterSchema(schema_pb.RegisterSchemaRequest(
            subject=SUBJECT, schema_type="avro", schema_definition=json.dumps(USER_V2).encode()), timeout=30)
    producer = await FastProducer.connect(broker.target, HOT, "avro-writer")
    try:
        await producer.send_records([frames.Record(avro(USER_V1, {"name": f"user{n}", "age": n % 100}),
                                                   schema_id=first.schema_id, schema_version=1)
                                     for n in range(HOT_RECORDS)])
        await producer.flush()
    finally:
        await producer.close()

    async def fill(name: str) -> None:
        async with slots:
            p = await FastProducer.connect(broker.target, name, "filler")
            try:
                await (await p.send_batch([f"{name} {n}".encode() for n in range(RECORDS_EACH)]))
            finally:
                await p.close()

    await asyncio.gather(*(fill(name) for name in names[LOADED_EVERY::LOADED_EVERY]))


async def produce_consume(broker: Broker, topic: str, seconds: float) -> tuple[float, float]:
    """(records/s produced, records/s consumed): `seconds` of batches to a new topic, flushed, then read back
    from its start; the topic is deleted after."""
    producer = await FastProducer.connect(broker.target, topic, "bench",
                                          max_inflight_bytes=IN_FLIGHT * BATCH_RECORDS * RECORD_BYTES)
    try:
        payloads = [b"r" * RECORD_BYTES] * BATCH_RECORDS
        sent = 0
        started = time.perf_counter()
        while time.perf_counter() - started < seconds:
            await producer.send_batch(payloads)
            sent += BATCH_RECORDS
        await producer.flush()
        produced = sent / (time.perf_counter() - started)
    finally:
        await producer.close()
    consumer = await FastConsumer.connect(broker.target, topic, "catch-up", "bench",
                                          initial_position="earliest")
    try:
        got = 0
        started = time.perf_counter()
        async for delivery in consumer.batches():
            got += delivery.last_offset - max(delivery.first_offset, consumer.start_offset) + 1
            await consumer.ack_cumulative(delivery.last_offset)
            if got >= sent:
                break
        consumed = got / (time.perf_counter() - started)
    finally:
        await consumer.close()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{broker.admin_port}") as channel:
        admin: Any = admin_grpc.TopicAdminStub(channel)  # type: ignore[no-untyped-call]
        await admin.DeleteTopic(admin_pb.TopicRequest(name=topic), timeout=60)
    if got != sent:
        raise RuntimeError(f"{topic}: {sent:,} records produced but {got:,} consumed")
    return produced, consumed


class Endpoints:
    """The console's JSON endpoints fetched with urllib, in a session of their own."""

    def __init__(self, base: str) -> None:
        self.base = base
        cookies = urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())
        self.opener = urllib.request.build_opener(cookies)
        self.get("/api/session")

    def get(self, path: str) -> float:
        """ms to the whole answer of `path`, checked to be a 200."""
        started = time.perf_counter()
        with self.opener.open(self.base + path, timeout=SCRIPT_TIMEOUT_S) as answer:
            answer.read()
            if answer.status != 200:
                raise RuntimeError(f"GET {path}: HTTP {answer.status}")
        return (time.perf_counter() - started) * 1000


def open_page(driver: webdriver.Chrome, page: Page) -> tuple[float, float]:
    """ms to render `page` from a navigation in the page, and to draw it; then the page is checked."""
    rendered, painted = driver.execute_async_script(NAVIGATE_JS, f"#/{page.route}", page.name)
    shown = driver.execute_script(CHECK_JS, page.table)
    if shown["error"] is not None or shown["rows"] != page.rows:
        raise RuntimeError(f"page {page.name}: {shown['rows']} rows of {page.table} (expected {page.rows}), "
                           f"error {shown['error']!r}")
    return float(rendered), float(painted)


def first_load(driver: webdriver.Chrome, base: str) -> float:
    """ms from driver.get of the overview (cache cleared) to its first data-rendered mark."""
    driver.get("about:blank")
    driver.execute_cdp_cmd("Network.clearBrowserCache", {})
    driver.get(f"{base}/#/overview")
    return float(driver.execute_async_script(FIRST_RENDER_JS))


def time_pages(driver: webdriver.Chrome, base: str, endpoints: Endpoints, shown: list[Page], opens: int
               ) -> Figures:
    first = [first_load(driver, base) for _ in range(opens)]  # ends on the overview, the last page of `shown`
    took: dict[str, list[float]] = {p.name: [] for p in shown}
    drawn: dict[str, list[float]] = {p.name: [] for p in shown}
    answered: dict[str, list[float]] = {p.name: [] for p in shown}
    for _ in range(opens):
        for page in shown:
            rendered, painted = open_page(driver, page)
            took[page.name].append(rendered)
            drawn[page.name].append(painted)
    for _ in range(opens):
        for page in shown:
            answered[page.name].append(endpoints.get(page.api))
    out = {"first_load_ms": median(first)}
    for page in shown:
        out[f"{page.name}_ms"] = median(took[page.name])
        out[f"{page.name}_painted_ms"] = median(drawn[page.name])
        out[f"{page.name}_api_ms"] = median(answered[page.name])
    return out


MODES = ("closed", "overview", "reloading")


def load_phase(driver: webdriver.Chrome, runner: asyncio.Runner, broker: Broker, topic: str, seconds: float,
               mode: str) -> tuple[float, float, float]:
    """(produce, consume, topics page reloads per second) in `mode` (MODES)."""
    base = broker.console_url()
    if mode == "closed":
        driver.get("about:blank")
        produced, consumed = runner.run(produce_consume(broker, topic, seconds))
        return produced, consumed, 0.0
    main = driver.current_window_handle
    driver.get(f"{base}/#/overview")
    if mode == "overview":
        time.sleep(SETTLE_S)
        produced, consumed = runner.run(produce_consume(broker, topic, seconds))
        return produced, consumed, 0.0
    driver.switch_to.new_window("window")
    try:
        script = driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": RELOAD_LOOP_JS})
        driver.get(f"{base}/#/topics")
        time.sleep(SETTLE_S)
        before = int(driver.execute_script("return Number(sessionStorage.getItem('reloads') || 0)"))
        started = time.perf_counter()
        produced, consumed = runner.run(produce_consume(broker, topic, seconds))
        elapsed = time.perf_counter() - started
        reloads = int(driver.execute_script("return Number(sessionStorage.getItem('reloads') || 0)")) - before
        driver.execute_cdp_cmd("Page.removeScriptToEvaluateOnNewDocument",
                               {"identifier": script["identifier"]})
    finally:
        driver.close()
        driver.switch_to.window(main)
    return produced, consumed, reloads / elapsed


def run_console(options: Options) -> list[Result]:
    topics = QUICK_TOPICS if options.quick else TOPICS
    subscriptions = QUICK_SUBSCRIPTIONS if options.quick else SUBSCRIPTIONS
    opens = QUICK_OPENS if options.quick else OPENS
    seconds = QUICK_PRODUCE_S if options.quick else PRODUCE_S
    shown = pages(topics, subscriptions)
    scratch = Path(tempfile.mkdtemp(prefix="danube-bench-console-", dir=options.parent_dir))
    runs: list[Figures] = []
    broker = Broker(scratch / "broker", console=True, die_with_parent=True)
    driver: webdriver.Chrome | None = None
    try:
        broker.start()
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            started = time.perf_counter()
            runner.run(populate(broker, topics, subscriptions))
            progress(f"{topics:,} topics, {subscriptions} subscriptions on {HOT} and its {HOT_RECORDS:,} "
                     f"records made in {time.perf_counter() - started:.1f} s")
            driver = chromium()
            driver.set_script_timeout(SCRIPT_TIMEOUT_S)
            driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": MARK_JS})
            base = broker.console_url()
            endpoints = Endpoints(base)
            for run in range(options.runs):
                figures = time_pages(driver, base, endpoints, shown, opens)
                for mode in MODES if run % 2 == 0 else reversed(MODES):
                    produced, consumed, reloads = load_phase(
                        driver, runner, broker, f"/default/load-{run}-{mode}", seconds, mode)
                    figures[f"produce_console_{mode}"] = produced
                    figures[f"consume_console_{mode}"] = consumed
                    if mode == "reloading":
                        figures["topics_reloads_per_s"] = reloads
                runs.append(figures)
                progress(f"run {run + 1}/{options.runs}: "
                         + ", ".join(f"{k} {v:,.1f}" for k, v in figures.items()))
    finally:
        if driver is not None:
            driver.quit()
        broker.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    return results(runs, shown)


def results(runs: list[Figures], shown: list[Page]) -> list[Result]:
    n = len(runs)

    def each(name: str) -> list[float]:
        return [r[name] for r in runs]

    out = [Result("first_load_ms", "ms", median(each("first_load_ms")), n, target=PAGE_TARGET)]
    for page in sorted(shown, key=lambda p: p.name != "overview"):
        name = f"{page.name}_ms"
        api = f"{page.name}_api_ms"
        out.append(Result(name, "ms", median(each(name)), n, median(each(api)),
                          paired_ratio(each(name), each(api)), PAGE_TARGET))
    for page in sorted(shown, key=lambda p: p.name != "overview"):
        name = f"{page.name}_painted_ms"
        out.append(Result(name, "ms", median(each(name)), n))
    for what in ("produce", "consume"):
        closed = each(f"{what}_console_closed")
        out.append(Result(f"{what}_console_closed", "records/s", median(closed), n))
        for mode, target in (("overview", LOAD_TARGET), ("reloading", None)):
            opened = each(f"{what}_console_{mode}")
            out.append(Result(f"{what}_console_{mode}", "records/s", median(opened), n, median(closed),
                              paired_ratio(opened, closed), target))
    out.append(Result("topics_reloads_per_s", "reloads/s", median(each("topics_reloads_per_s")), n))
    return out


RUNS_NOTE = ("pages: each run's figure is the median of its opens; produce and consume: one pair a run, the "
             "console closed or open first in turn")


def load_line(quick: bool) -> str:
    topics = QUICK_TOPICS if quick else TOPICS
    subscriptions = QUICK_SUBSCRIPTIONS if quick else SUBSCRIPTIONS
    opens = QUICK_OPENS if quick else OPENS
    seconds = QUICK_PRODUCE_S if quick else PRODUCE_S
    return (f"- Load: {topics:,} Reliable topics in {len(NAMESPACES)} namespaces; {HOT} with "
            f"{subscriptions} subscriptions and {HOT_RECORDS:,} Avro records (the browser shows "
            f"{BROWSE_RECORDS}); a subject of 2 versions; each page opened {opens} times a run in Debian's "
            f"headless Chromium; {seconds:g} s of produce ({BATCH_RECORDS:,} records of {RECORD_BYTES} B a "
            "batch) then a catch-up consume, with the console closed, open on its overview (refreshing "
            "itself every 5 s), and reloading (the overview in one window, the topics page reloaded "
            f"{RELOAD_MS} ms after each render in another)")
