"""Room ``spec``: the spec-verify ring (``--enable-linear-replayssm-spec``): ``ring`` its folds before
SGLang's donation, retraction backup and extend; ``hooks`` this room's hooks table."""
