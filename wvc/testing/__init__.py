"""Test helpers shipped with wvc (a local Hub-compatible server)."""
