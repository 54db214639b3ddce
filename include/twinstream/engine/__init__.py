"""The engine wing: what runs in an engine process (its lifecycle, the query plan, keyed state,
snapshots, recovery, the admin API) and the one client of that API."""
