"""danube_fast's own client for the fast API (proto/FastApi.proto): batches of records on streams."""

from danube_fast.client.consumer import Delivery, FastConsumer
from danube_fast.client.producer import FastProducer, ProduceRejected

__all__ = ["Delivery", "FastConsumer", "FastProducer", "ProduceRejected"]
