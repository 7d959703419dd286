"""Subscriptions' dispatchers: which consumer gets a message, and (reliable) until when it must ack."""
