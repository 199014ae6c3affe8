"""Data: fetching the real Chinese datasets into a local cache (``fetch``), preprocessing and task datasets."""
