"""The report on disk: the dataset written (staged, committed, recovered), its metadata, and DuckDB over it; imports only common/."""
