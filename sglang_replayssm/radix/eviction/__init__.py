"""Room ``eviction``: the order the tree evicts in: ``order`` the mamba states (states on reused paths last,
and the TreeCore that lets it be set); ``stateless_kv`` the KV leaves (leaves no match can use first); ``hooks``
this room's hooks table."""
