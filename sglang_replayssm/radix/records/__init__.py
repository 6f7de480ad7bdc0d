"""Room ``records``: prefix hits at any depth from stored layer inputs (fix ``record_hits``).

``pool`` the record pool; ``capture`` records written by every forward; ``interval_states`` the kept
per-chunk states; ``match`` planting a rebuilt state on a records-only match; ``rebuild`` the rebuild;
``budget`` the pool's reservation out of the KV budget; ``hooks`` this room's hooks table;
``hicache/`` records with HiCache (host backup and load-back, host hits, L3 storage).
"""
