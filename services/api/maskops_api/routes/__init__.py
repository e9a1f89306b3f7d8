"""One thin router per resource; writes go through :mod:`maskops_api.services`."""
