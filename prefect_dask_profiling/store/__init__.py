"""Object storage for runs: layout, URL validation, manifests, writing, spool, lifecycle."""
