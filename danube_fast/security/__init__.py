"""Security (docs/SECURITY.md): `[security]` settings (config), TLS material (tls), JWT verification and
signing (tokens), roles and bindings (rbac), what each call needs (rules), and the gate every call passes
(gate, hooked in broker/services/wire_guard.py)."""
