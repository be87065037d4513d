"""Stage 1, tag: range names, range emitters, call shapes, the tagger (transformers hook, head split,
backward ranges, the manual API) and the live attention statistics."""
