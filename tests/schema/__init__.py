"""The hypothesis file: loading, the design, conditions, messages that point at the field, bad input and fuzzing."""
