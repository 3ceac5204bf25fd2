"""The command line and the processes it runs (API, worker, dev, demo, status)."""
