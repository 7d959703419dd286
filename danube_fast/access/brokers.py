"""A broker's client side, for readers and writers outside the package (danube_fast/access)."""

from danube_fast.client import FastProducer
from danube_fast.client.credentials import Credentials, open_channel
from danube_fast.client.lookup import CHANNEL_OPTIONS
from danube_fast.client.producer import Offsets
from danube_fast.client.reader import TopicReader
from danube_fast.errors import ApiError

__all__ = ["CHANNEL_OPTIONS", "ApiError", "Credentials", "FastProducer", "Offsets", "TopicReader",
           "open_channel"]
