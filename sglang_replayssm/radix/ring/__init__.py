"""Room ``ring``: the decode ring of a mamba pool (core; no feature room is imported from here).

``pool`` the ring view of a pool (cursor, fold, materialize); ``decode_metadata`` the device cursor and
KDA force flush of the decode metadata; ``kernel_binding`` the ring decode kernel in SGLang's
packed-decode; ``alloc_reset`` empty rings on every slot handed out; ``snapshot`` exact track snapshot
and slot copy; ``movers`` fold before extend, exact CPU backup; ``donation`` no_buffer finish donation;
``hooks`` this room's hooks table. A feature that changes a ring behaviour installs a strategy into
``sglang_replayssm.strategies.STRATEGIES`` through this room's installers (``pool.use_checkpoint_copies``,
``donation.use_end_state``).
"""
