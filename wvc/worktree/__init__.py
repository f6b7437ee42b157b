"""The working tree: which files are tracked and their content ids (``scan``, with the stat
cache), files or a state dict turned into chunks and a tree (``snapshot``), a version's files
rebuilt from chunks (``materialize``), and the working tree refreshed to a commit made elsewhere
(``refresh``)."""
