"""`python -m sglang_replayssm.models`: the make-models CLI."""

from sglang_replayssm.models.build import main

raise SystemExit(main())
