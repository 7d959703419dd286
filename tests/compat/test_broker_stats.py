"""BrokerStats (proto/BrokerStats.proto): a broker's totals and each served topic's live figures, as its
parts hold them; a filter by topic; refusals by the same RBAC as every admin call (tests/security)."""

from __future__ import annotations

import grpc
from compat_support import run_async

from danube_fast.client import FastProducer
from danube_fast.proto import BrokerStats_pb2 as pb
from danube_fast.proto import BrokerStats_pb2_grpc as pb_grpc
from danube_fast.proto import SubscriptionAdmin_pb2 as subs_pb
from danube_fast.proto import SubscriptionAdmin_pb2_grpc as subs_grpc
from danube_fast.testing.broker import BrokerFactory


def test_figures_are_the_topics_own(broker_factory: BrokerFactory) -> None:
    broker = broker_factory.start()

    async def scenario() -> None:
        producer = await FastProducer.connect(broker.target, "/default/counted", "p1")
        try:
            await producer.send_batch([b"x" * 100] * 10)
            await producer.flush()
            async with grpc.aio.insecure_channel(f"127.0.0.1:{broker.admin_port}") as channel:
                await subs_grpc.SubscriptionAdminStub(channel).Create(
                    subs_pb.CreateRequest(topic="/default/counted", subscription="s", earliest=True))
                stats = pb_grpc.BrokerStatsStub(channel)
                everything = await stats.Figures(pb.FiguresRequest())
                one = await stats.Figures(pb.FiguresRequest(topics=["/default/counted"]))
                none = await stats.Figures(pb.FiguresRequest(no_topics=True))
        finally:
            await producer.close()
        (b,) = everything.brokers
        assert b.error == "" and b.messages_in == 10 and b.bytes_in >= 1000 and b.messages_out == 0
        (t,) = [t for t in b.topics if t.stored_topic == "/default/counted"]
        assert (t.start_offset, t.end_offset, list(t.producers), t.subscriptions, t.backlog) == \
            (0, 10, ["p1"], 1, 10)
        assert t.wal_bytes >= 10 * 100  # ten payloads of 100 bytes, framed
        assert [t.stored_topic for t in one.brokers[0].topics] == ["/default/counted"]
        assert list(none.brokers[0].topics) == [] and none.brokers[0].messages_in == 10

    run_async(scenario())
