"""The object model: what a version is, independent of where it is stored.

- ``versions``: trees and commits, their canonical bytes and ids, the chunk-size rules.
- ``layout``: which bytes of a file each chunk of its tree entry covers.
- ``tree_diff``: a tree as the chunk ids that changed in another (catalogs' tree deltas, step records).
- ``merge_methods``: the merge strategies' arithmetic on tensors.
"""
