"""What the user wrote: the hypotheses file, engine presets, metric definitions, secrets, flag checks."""
