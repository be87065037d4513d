"""What this machine can do: ``headcount doctor``'s checks and the measured copy ceiling (``headcount calibrate``)."""
