"""File formats wvc understands (pure parsing, no torch)."""
