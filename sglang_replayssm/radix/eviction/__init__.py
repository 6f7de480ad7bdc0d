"""Room ``eviction``: the order the tree's mamba states are evicted in: ``order`` states on reused paths
last (and the TreeCore that lets it be set); ``hooks`` this room's hooks table."""
