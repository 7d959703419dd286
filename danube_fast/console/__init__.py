"""The web console every broker can serve (docs/CONSOLE.md): pages in the package (static/), JSON endpoints
(api.py) made of admin calls as the signed-in user (calls.py), sessions (sessions.py), the listener
(server.py), built by build.py for the composition root."""
