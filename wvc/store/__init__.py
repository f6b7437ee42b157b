"""Storage: the SQLite database, pack files, the object store and refs."""
