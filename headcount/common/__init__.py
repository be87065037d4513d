"""The ground (docs/architecture.md § The house): what several stages read, torch-free; imports nothing else of headcount."""
