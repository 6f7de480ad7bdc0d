"""Room ``read_copy``: a low-precision copy of every checkpoint read by the decode step
(``SGLANG_REPLAYSSM_READ_COPY``). ``store`` allocation, lookup, stale marks, replay and the decode step;
``ring_strategy`` what it installs into the ring (folds, kernel binding); ``budget`` its bytes per slot;
``hooks`` this room's hooks table."""
