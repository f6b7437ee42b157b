"""Base models: the model a history starts from, referenced in place and never stored.

``record`` (the reference and its hf:// form), ``download`` (the Hub cache), ``index``
(where each chunk lies in the base's files), ``remote_chunks`` (base chunks for a remote
view), ``setup`` (set a base up in a repository, find its files again, fsck them).
"""
