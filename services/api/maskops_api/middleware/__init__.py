"""ASGI middleware of the API: request body limits, Host/Origin checks, the status
shortcut for pollers, and metrics and request logs (observability)."""
