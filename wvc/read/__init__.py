"""Reading versions without a working tree: tensors out of a version (``tensors``), a version
of a local or remote repository opened for streaming reads and downloaded as plain files
(``view``: ``wvc.open``, ``wvc.snapshot_download``) into the version cache (``cache``), and a
live follower applying each new version of a branch to tensors in memory (``follower``:
``wvc.follow``)."""
