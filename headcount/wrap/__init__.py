"""``headcount run``: the launcher, the hook inside the program (child + autotag) and the per-rank assembly."""
