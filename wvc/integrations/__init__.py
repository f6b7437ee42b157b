"""Integrations with training libraries (optional extras: ``pip install wvc[train]``)."""
