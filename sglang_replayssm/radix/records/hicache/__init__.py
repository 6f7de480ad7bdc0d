"""Records with HiCache: ``host_records`` host backup and load-back of records, planted-state locks;
``host_hits`` hits on host-only nodes covered by records; ``storage`` records beside L3 pages;
``hooks`` their hooks table."""
