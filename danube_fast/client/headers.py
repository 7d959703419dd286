"""Request headers of ours on the Danube API: optional, so that the official client's wire stays as it is."""

# ConsumerService.Subscribe: where a subscription the call creates starts: earliest, latest or an offset
# (docs/SUBSCRIPTIONS.md, "Creating a subscription at a position").
INITIAL_POSITION = "danube-initial-position"
