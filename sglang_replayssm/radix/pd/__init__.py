"""Room ``pd``: prefill/decode disaggregation: ``decode_pool`` the decode ring on the PD decode
server's pool and its admission; ``hits`` the decode server's own prefix hits; ``hooks`` this room's
hooks table."""
