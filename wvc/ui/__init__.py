"""``wvc ui`` and ``wvc plot``: a read-only local view of a history (data.py gathers the
numbers, svg.py draws them, pages.py lays out the views, server.py serves them on loopback)."""
