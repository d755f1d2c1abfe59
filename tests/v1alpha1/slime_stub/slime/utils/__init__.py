"""The stand-in's `slime.utils`."""
