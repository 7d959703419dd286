"""The native transport (docs/TRANSPORT.md): frames over TCP for the fast API."""
