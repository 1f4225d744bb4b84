"""Sample efficiency: curves, samples-to-target R(B), the critical batch and its fits."""
